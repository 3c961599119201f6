//! Logging setup for the binary: a `tracing` subscriber writing to stderr whose level can be
//! changed while the server runs (SIGHUP with a new `log-level`), through a reload handle kept
//! here. What is logged is decided where it happens: one line per connection opened or closed
//! and per auto-release at `info`, nothing per operation unless `debug` or `trace` is on.

use std::sync::OnceLock;

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, Registry};

static LEVEL: OnceLock<reload::Handle<LevelFilter, Registry>> = OnceLock::new();

/// A log level that is not one of error, warn, info, debug, trace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    #[error("log-level '{0}' is not one of error, warn, info, debug, trace")]
    BadLevel(String),
    #[error("logging is already set up")]
    AlreadySet,
    #[error("logging is not set up: the level cannot change")]
    NotSet,
}

/// Parses a `--log-level` value.
pub fn parse_level(level: &str) -> Result<LevelFilter, LogError> {
    match level {
        "error" | "warn" | "info" | "debug" | "trace" => level
            .parse()
            .map_err(|_| LogError::BadLevel(level.to_string())),
        _ => Err(LogError::BadLevel(level.to_string())),
    }
}

/// Installs the global subscriber at `level` (once per process), writing to stderr, in colour
/// when `ansi`.
pub fn init(level: &str, ansi: bool) -> Result<(), LogError> {
    let filter = parse_level(level)?;
    let (layer, handle) = reload::Layer::new(filter);
    LEVEL.set(handle).map_err(|_| LogError::AlreadySet)?;
    tracing_subscriber::registry()
        .with(layer)
        .with(fmt::layer().with_writer(std::io::stderr).with_ansi(ansi))
        .try_init()
        .map_err(|_| LogError::AlreadySet)
}

/// Changes the level of the subscriber [`init`] installed. Returns the previous level.
pub fn set_level(level: &str) -> Result<LevelFilter, LogError> {
    let filter = parse_level(level)?;
    let handle = LEVEL.get().ok_or(LogError::NotSet)?;
    let mut old = LevelFilter::OFF;
    handle
        .modify(|f| old = std::mem::replace(f, filter))
        .map_err(|_| LogError::NotSet)?;
    Ok(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_bad_ones_are_named() {
        assert_eq!(parse_level("debug"), Ok(LevelFilter::DEBUG));
        assert_eq!(parse_level("error"), Ok(LevelFilter::ERROR));
        let e = parse_level("loud").unwrap_err().to_string();
        assert!(e.contains("'loud'"), "{e}");
        assert!(
            parse_level("off").is_err(),
            "off is not offered: errors must stay visible"
        );
    }
}
