//! `tarq ctl user ...`: users and grants through the server's own calls — Tarantool's
//! `box.schema.user.create` / `passwd` / `grant` / `revoke` / `drop`, and tarq's `tarq.users`
//! for the list and `tarq.user_limits` for a user's own limits — so ctl says nothing the IPROTO API does not, and a refusal is the server's
//! (Tarantool's words). A password not given on the command line, where other local users can
//! read it, is read from standard input.

use std::io::BufRead;

use clap::Subcommand;
use rmpv::Value;

/// The call that lists users and their grants (an administrator's).
pub const LIST: &str = "tarq.users";
/// The call that sets a user's own limits (an administrator's).
pub const LIMITS: &str = "tarq.user_limits";

#[derive(Debug, Clone, Subcommand)]
pub enum UserOp {
    /// Creates user NAME with PASSWORD (read from standard input when not given).
    Add {
        name: String,
        password: Option<String>,
    },
    /// Sets NAME's password (read from standard input when not given).
    Passwd {
        name: String,
        password: Option<String>,
    },
    /// Grants RIGHTS (put, take, admin; comma-separated) on --tube (`*`: every tube), or the
    /// cluster's admin right with --cluster.
    Grant {
        name: String,
        rights: Option<String>,
        #[arg(long)]
        cluster: bool,
    },
    /// Takes RIGHTS on --tube back, or the cluster's admin right with --cluster.
    Revoke {
        name: String,
        rights: Option<String>,
        #[arg(long)]
        cluster: bool,
    },
    /// Sets NAME's own limits over the server's --user-max-connections and --user-put-rate:
    /// each a whole number (0: no limit for this user) or `default` (the server's again); one
    /// not given stays as it is.
    Limit {
        name: String,
        #[arg(long, value_name = "N|default")]
        max_connections: Option<String>,
        #[arg(long, value_name = "PUTS|default")]
        put_rate: Option<String>,
    },
    /// Every user with its grants and own limits, as JSON.
    List,
    /// Drops user NAME.
    Drop { name: String },
}

/// The function and arguments of `op`; `tube` is ctl's `--tube`.
pub fn call_of(op: UserOp, tube: Option<&str>) -> anyhow::Result<(String, Vec<Value>)> {
    let call = |f: &str| format!("box.schema.user.{f}");
    Ok(match op {
        UserOp::Add { name, password } => {
            let password = password_or_stdin(password)?;
            let opts = Value::Map(vec![(Value::from("password"), Value::from(password))]);
            (call("create"), vec![Value::from(name), opts])
        }
        UserOp::Passwd { name, password } => {
            let password = password_or_stdin(password)?;
            (
                call("passwd"),
                vec![Value::from(name), Value::from(password)],
            )
        }
        UserOp::Grant {
            name,
            rights,
            cluster,
        } => (call("grant"), object(name, rights, cluster, tube)?),
        UserOp::Revoke {
            name,
            rights,
            cluster,
        } => (call("revoke"), object(name, rights, cluster, tube)?),
        UserOp::Limit {
            name,
            max_connections,
            put_rate,
        } => {
            let mut limits = Vec::new();
            for (key, given) in [("max_connections", max_connections), ("put_rate", put_rate)] {
                let Some(given) = given else { continue };
                let value = match given.parse::<u64>() {
                    Ok(n) => Value::from(n),
                    Err(_) if given == "default" => Value::from("default"),
                    Err(_) => anyhow::bail!(
                        "--{} {given:?}: a whole number or default",
                        key.replace('_', "-")
                    ),
                };
                limits.push((Value::from(key), value));
            }
            anyhow::ensure!(
                !limits.is_empty(),
                "give --max-connections, --put-rate or both"
            );
            (
                LIMITS.to_owned(),
                vec![Value::from(name), Value::Map(limits)],
            )
        }
        UserOp::List => (LIST.to_owned(), vec![]),
        UserOp::Drop { name } => (call("drop"), vec![Value::from(name)]),
    })
}

/// The arguments of a grant or revoke: on the universe (the cluster's admin) or on a tube.
fn object(
    name: String,
    rights: Option<String>,
    cluster: bool,
    tube: Option<&str>,
) -> anyhow::Result<Vec<Value>> {
    let name = Value::from(name);
    match (cluster, rights, tube) {
        (true, None, _) => Ok(vec![name, Value::from("execute"), Value::from("universe")]),
        (true, Some(r), _) => {
            anyhow::bail!("--cluster grants the cluster's admin right: give no rights ({r})")
        }
        (false, Some(r), Some(t)) => Ok(vec![
            name,
            Value::from(r),
            Value::from("tube"),
            Value::from(t),
        ]),
        (false, None, _) => anyhow::bail!("give the rights (put, take, admin) or --cluster"),
        (false, Some(_), None) => {
            anyhow::bail!("rights are on a tube: give --tube NAME (`*` for every tube)")
        }
    }
}

fn password_or_stdin(given: Option<String>) -> anyhow::Result<String> {
    if let Some(p) = given {
        return Ok(p);
    }
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let p = line.strip_suffix('\n').unwrap_or(&line);
    let p = p.strip_suffix('\r').unwrap_or(p);
    anyhow::ensure!(
        !p.is_empty(),
        "no password given (as an argument or on standard input)"
    );
    Ok(p.to_owned())
}
