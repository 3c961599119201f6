//! Shared helpers for the criterion benches under `benches/`.
