//! Speculative rounds: `spec_begin` remembers the ring, the round's updates
//! are recorded, and `spec_rollback` keeps what the host accepted. mlx-lm's
//! speculative decoding only trims (and cannot once the ring has wrapped);
//! the rest follows from its own pieces.
//!
//! A serial cache keeps one count. While the ring has not wrapped, the
//! rollback is mlx-lm's trim. A round that wrapped it overwrote slots, so
//! the ring goes back to the round's start and the kept tokens are
//! appended again (the round keeps its inputs for that).
//!
//! A batch keeps a count per row, and its round is one update of `[B, k+1]`
//! tokens. After a multi-token update the storage is in temporal order with
//! the round's columns last, so dropping rejected tokens is a trim of the
//! columns no row keeps, then, for a row that kept fewer than the
//! most-keeping row, a roll of its storage to the right by the difference:
//! its dead columns come round to the front and become left padding, its
//! offset goes back by as many. That is how mlx-lm's `finalize` turns right
//! padding into left padding. Each row then holds exactly what it would
//! hold had it never seen the rejected tokens: the concat kept
//! `max_size - 1` columns before the round, and the window needs
//! `window - 1` of them at most. A round in which no row keeps anything
//! restores the ring of `spec_begin`.
//!
//! The two differ because a replay rebuilds, slot for slot, the ring of a
//! cache that never saw the rejected tokens (one kept token is written in
//! place, as mlx-lm writes single tokens) but needs one count for all rows;
//! the per-row roll keeps the same keys, in temporal order.

use crate::columns::{cols, len, roll_rows};
use crate::ring::Ring;
use model_kit::{Array, Result};
use plugin_api::PluginError;
use plugin_sdk::{mlx_error, mlx_rs};

pub(crate) enum Round {
    /// One row, undone by a trim or by a replay of the kept tokens.
    Serial { start: Ring, inputs: Vec<(Array, Array)> },
    /// A count per row; `updates` since `spec_begin`, and the tokens they
    /// appended to each row.
    Rows { start: Ring, updates: usize, appended: usize },
}

impl Round {
    pub fn serial(ring: &Ring) -> Self {
        Round::Serial { start: ring.clone(), inputs: Vec::new() }
    }

    pub fn rows(ring: &Ring) -> Self {
        Round::Rows { start: ring.clone(), updates: 0, appended: 0 }
    }

    /// Notes an update of the round.
    pub fn record(&mut self, k: &Array, v: &Array) {
        match self {
            Round::Serial { inputs, .. } => inputs.push((k.clone(), v.clone())),
            Round::Rows { updates, appended, .. } => {
                *updates += 1;
                *appended += len(k);
            }
        }
    }

    /// Keeps `keep` of the tokens appended since `spec_begin`: one count,
    /// or (batched) one per row.
    pub fn rollback(self, ring: &mut Ring, keep: &[u64]) -> std::result::Result<(), PluginError> {
        match self {
            Round::Serial { start, inputs } => rollback_serial(ring, start, inputs, keep),
            Round::Rows { start, updates, appended } => rollback_rows(ring, start, updates, appended, keep),
        }
    }
}

fn rollback_serial(
    ring: &mut Ring,
    start: Ring,
    inputs: Vec<(Array, Array)>,
    keep: &[u64],
) -> std::result::Result<(), PluginError> {
    let &[kept] = keep else {
        return Err(PluginError::invalid_input(format!(
            "kv-rotating holds 1 row; spec_rollback got {} keep counts",
            keep.len()
        )));
    };
    let appended = ring.seen.saturating_sub(start.seen);
    let kept = (kept as usize).min(appended);
    if ring.trimmable() {
        ring.trim((appended - kept) as u64);
        return Ok(());
    }
    *ring = start;
    if kept > 0 {
        let (ks, vs): (Vec<Array>, Vec<Array>) = inputs.into_iter().unzip();
        let mut replay = || -> Result<()> {
            let k = cols(&mlx_rs::ops::concatenate(&ks, 2)?, 0, kept)?;
            let v = cols(&mlx_rs::ops::concatenate(&vs, 2)?, 0, kept)?;
            ring.store(k, v)?;
            Ok(())
        };
        replay().map_err(mlx_error)?;
    }
    Ok(())
}

fn rollback_rows(
    ring: &mut Ring,
    start: Ring,
    updates: usize,
    appended: usize,
    keep: &[u64],
) -> std::result::Result<(), PluginError> {
    if keep.is_empty() || (keep.len() != 1 && keep.len() != ring.rows()) {
        return Err(PluginError::invalid_input(format!(
            "spec_rollback: {} keep counts for {} rows",
            keep.len(),
            ring.rows()
        )));
    }
    let kept: Vec<usize> =
        (0..ring.rows()).map(|r| (keep[if keep.len() == 1 { 0 } else { r }] as usize).min(appended)).collect();
    let most = kept.iter().copied().max().unwrap_or(0);
    if kept.iter().all(|&k| k == appended) {
        return Ok(());
    }
    if most == 0 {
        *ring = start;
        return Ok(());
    }
    if updates != 1 {
        return Err(PluginError::unsupported(format!(
            "kv-rotating: a batched round is one update; {updates} updates cannot be rolled back per row"
        )));
    }
    drop_tail(ring, appended - most, &kept, most).map_err(mlx_error)
}

/// Trims the `tail` columns no row keeps, then rolls each row that kept
/// fewer than `most` right by the difference.
fn drop_tail(ring: &mut Ring, tail: usize, kept: &[usize], most: usize) -> Result<()> {
    ring.linear()?;
    let end = ring.idx - tail;
    let shifts: Vec<usize> = kept.iter().map(|&k| most - k).collect();
    let any = shifts.iter().any(|&d| d > 0);
    if let (Some(k), Some(v)) = (ring.keys.take(), ring.values.take()) {
        let (k, v) = (cols(&k, 0, end)?, cols(&v, 0, end)?);
        ring.keys = Some(if any { roll_rows(&k, &shifts)? } else { k });
        ring.values = Some(if any { roll_rows(&v, &shifts)? } else { v });
    }
    ring.idx = end;
    ring.seen -= tail;
    for (r, &d) in shifts.iter().enumerate() {
        ring.left_pad[r] += d;
        ring.offsets[r] -= (tail + d) as i64;
    }
    Ok(())
}
