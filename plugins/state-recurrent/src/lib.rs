//! Cache layout `state-recurrent`: the fixed-size state of a linear-attention
//! layer (gated DeltaNet and kin), as mlx-lm's `ArraysCache` keeps it.
//!
//! The layer need declares the per-row shape of each slot
//! (`LayerNeed::state_shapes`); slot 0 is always the causal conv's window of
//! the last `K - 1` inputs `[K-1, C]`, the others are the layer's own (for
//! gated DeltaNet slot 1 is the SSM state `[Hv, Dv, Dk]`, float32).
//!
//! The graph's protocol for one layer:
//! 1. `update_and_fetch(inputs, _)` with the new conv inputs `[B, L, C]`
//!    (`values` is ignored): returns the conv window `[B, K-1+L, C]` (the
//!    stored inputs, zeros before the first call, then the new ones) as
//!    `keys` and `values`, keeps its last `K-1` as slot 0, and advances every
//!    row by L tokens (real ones: see padding below). This is the only
//!    call that counts tokens.
//! 2. `get_slot(i)` / `set_slot(i, state)` for the other slots (None until
//!    first written: the graph starts from zeros, as mlx-lm does).
//!
//! Left padding exists only while a cohort prefills: `begin_padded(pads)`
//! makes an empty cache hold rows whose next columns start with `pads[r]`
//! padding ones (rows merged later carry their own state and need none).
//! While padding is pending, `attention_mask(L)` (asked before the update)
//! is `ARRAY` with a bool `[B, L]` array, true = real column (mlx-lm's
//! `ArraysCache.make_mask`): the graph zeroes the padded conv inputs with it
//! and leaves the state untouched on padded steps. Padding may span several
//! updates; once every row's is consumed the mask is `NONE`. Offsets count
//! real tokens only; exported state carries the padding still to come.
//!
//! Not trimmable (a state cannot forget the last n tokens): a speculative
//! round snapshots the state at `spec_begin` and a rollback that drops
//! anything restores it, leaving the layout at the round's start for the
//! host to replay the kept tokens (`spec-replay`). Rows may keep different
//! counts (a batched round): the layout remembers each row's count, and the
//! host replays every row's kept tokens in ONE forward of the longest count,
//! shorter rows followed by filler. For that update `attention_mask` marks
//! the filler as padding (the graph keeps the state on padded steps, as for
//! left padding) and the window of each row ends at its last kept input.
//! Until that update the state cannot be exported. Nothing grows with the
//! context, so `bytes_per_token` is 0.
//!
//! A round's first update can spare that replay: the layout then keeps the
//! update's conv window and asks the graph (`wants_position_states`, after
//! `update_and_fetch`) for the state after each position of the update;
//! a rollback then picks, per row, the state after its last kept position
//! and the window ending at its last kept input (`round_states`), and the host
//! sees (`rolls_back_in_place`) that nothing is left to replay. A graph that
//! hands no position states gets the replay as before.

mod round_states;
mod state;

use model_kit::ops::dtype_from_raw;
use model_kit::{error, Array, Dtype, Result};
use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSlice, RString, RVec};
use plugin_api::*;
use plugin_sdk::{guard, guard_mlx, into_array, into_tensor, quietly, rstrings};
use round_states::RoundStates;
use state::State;

plugin_sdk::export_plugin! {
    manifest: manifest,
    new_cache: new_cache,
}

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::CACHE_LAYOUT,
        "fixed-size recurrent state (conv window + SSM state) of linear-attention layers, as mlx-lm's ArraysCache",
        Claims { cache_needs: rstrings(&["recurrent"]), cache_schemes: rstrings(&["plain"]), ..Default::default() },
        &[caps::SPEC_ROUND, caps::SPEC_REPLAY, caps::SPEC_PIPELINE, caps::STATE_IO, caps::ROWS],
    )
}

/// Elements one slot may hold per row; bigger declarations are refused
/// before MLX is asked to allocate them.
const MAX_SLOT_ELEMENTS: i64 = 1 << 30;

fn new_cache(spec: &CacheSpec) -> std::result::Result<CacheBox, PluginError> {
    if spec.need.kind != NeedKind::RECURRENT {
        return Err(PluginError::unsupported(format!(
            "state-recurrent serves recurrent layers, not `{}`",
            spec.need.kind.as_str()
        )));
    }
    if spec.scheme.as_str() != "plain" {
        return Err(PluginError::unsupported(format!("state-recurrent has no scheme `{}`", spec.scheme)));
    }
    let dtype = dtype_from_raw(spec.dtype.0).map_err(|e| PluginError::invalid_input(e.what()))?;
    let shapes: Vec<Vec<i64>> = spec.need.state_shapes.iter().map(|s| s.to_vec()).collect();
    let bad = |why: &str| Err(PluginError::invalid_input(format!("state-recurrent: state_shapes {shapes:?}: {why}")));
    if shapes.is_empty() {
        return bad("no slots declared");
    }
    if shapes[0].len() != 2 {
        return bad("slot 0 must be the conv window [K-1, C]");
    }
    for s in &shapes {
        let mut n: i64 = 1;
        for &d in s {
            if d <= 0 || d >= 1 << 31 {
                return bad("every dimension must be positive and below 2^31");
            }
            n = n.saturating_mul(d);
        }
        if n > MAX_SLOT_ELEMENTS {
            return bad("a slot is too large");
        }
    }
    let layout = Recurrent { state: State::empty(shapes.len(), spec.rows as usize), shapes, dtype, rounds: Vec::new() };
    Ok(CacheLayout_TO::from_value(layout, TD_Opaque))
}

struct Recurrent {
    state: State,
    /// Per-row shape of each slot (the need's `state_shapes`).
    shapes: Vec<Vec<i64>>,
    /// The model's dtype (identity only: each slot keeps the dtype written).
    dtype: Dtype,
    /// Open speculative rounds, oldest first (they overlap when the host
    /// pipelines rounds: `caps::SPEC_PIPELINE`).
    rounds: Vec<Round>,
}

/// A speculative round under way.
struct Round {
    /// The state at `spec_begin` (arrays are immutable: handles suffice).
    start: State,
    /// Whether an update has run since `spec_begin`.
    updated: bool,
    /// The round's first update's window and position states, for a
    /// rollback without a replay; None when that update could not have them
    /// (it replayed kept tokens or consumed left padding) or a second
    /// update followed.
    positions: Option<RoundStates>,
}

impl Recurrent {
    fn signature(&self) -> RString {
        let shapes: Vec<String> =
            self.shapes.iter().map(|s| s.iter().map(i64::to_string).collect::<Vec<_>>().join("x")).collect();
        format!("state:recurrent:{:?}:{}", self.dtype, shapes.join(":")).to_lowercase().into()
    }

    /// `[rows, ..shapes[i]]`.
    fn full_shape(&self, i: usize, rows: usize) -> Vec<i32> {
        std::iter::once(rows as i32).chain(self.shapes[i].iter().map(|&d| d as i32)).collect()
    }

    fn slot_index(&self, i: u32) -> std::result::Result<usize, PluginError> {
        let i = i as usize;
        if i >= self.shapes.len() {
            return Err(PluginError::invalid_input(format!(
                "state-recurrent: slot {i} does not exist ({} declared)",
                self.shapes.len()
            )));
        }
        Ok(i)
    }

    fn fetch(&mut self, inputs: Array) -> Result<Array> {
        let want = [self.state.rows() as i32, self.shapes[0][1] as i32];
        let s = inputs.shape();
        if s.len() != 3 || [s[0], s[2]] != want {
            return Err(error(format!(
                "state-recurrent: conv inputs {s:?} do not match [rows, L, C] = [{}, L, {}]",
                want[0], want[1]
            )));
        }
        self.state.conv_window(&inputs, self.shapes[0][0] as i32)
    }

    /// Exported as: the written slots (in slot order), and meta =
    /// `[rows, bitmask of written slots, offset of each row]`, followed by
    /// each row's pending padding while a padded prefill is under way.
    fn export(&self, st: &State) -> CacheState {
        let mut mask = 0u64;
        let mut tensors = RVec::new();
        for (i, s) in st.slots.iter().enumerate() {
            if let Some(a) = s {
                mask |= 1 << i;
                tensors.push(into_tensor(a.clone()));
            }
        }
        let mut meta: RVec<u64> = RVec::new();
        meta.push(st.offsets.len() as u64);
        meta.push(mask);
        meta.extend(st.offsets.iter().copied());
        if st.padding_pending() {
            meta.extend(st.pads.iter().copied());
        }
        CacheState { signature: self.signature(), offset: st.offsets.iter().copied().max().unwrap_or(0), tensors, meta }
    }

    fn import(&self, state: CacheState) -> std::result::Result<State, PluginError> {
        if state.signature != self.signature() {
            return Err(PluginError::invalid_input(format!(
                "state of `{}` cannot be imported into `{}`",
                state.signature,
                self.signature()
            )));
        }
        let bad = |why: String| PluginError::invalid_input(format!("state-recurrent state: {why}"));
        let meta = state.meta.as_slice();
        let (rows, mask, padded) = match meta {
            [rows, mask, ..]
                if (meta.len() as u64 == 2 + rows || meta.len() as u64 == 2 + 2 * rows)
                    && *mask >> self.shapes.len() == 0 =>
            {
                (*rows as usize, *mask, meta.len() as u64 > 2 + rows)
            }
            _ => return Err(bad(format!("malformed metadata {meta:?}"))),
        };
        if state.tensors.len() != mask.count_ones() as usize {
            return Err(bad(format!("{} tensors for slot mask {mask:#b}", state.tensors.len())));
        }
        let mut tensors = state.tensors.into_iter();
        let mut slots = Vec::with_capacity(self.shapes.len());
        for i in 0..self.shapes.len() {
            if mask & (1 << i) == 0 {
                slots.push(None);
                continue;
            }
            let a = into_array(tensors.next().ok_or_else(|| bad("missing tensor".into()))?);
            if a.shape() != self.full_shape(i, rows).as_slice() {
                return Err(bad(format!("slot {i} is {:?}, expected {:?}", a.shape(), self.full_shape(i, rows))));
            }
            slots.push(Some(a));
        }
        let pads = if padded { meta[2 + rows..].to_vec() } else { vec![0; rows] };
        Ok(State { slots, offsets: meta[2..2 + rows].to_vec(), pads, replay: None })
    }

    fn rollback(&mut self, keep: &[u64]) -> std::result::Result<(), PluginError> {
        if self.rounds.is_empty() {
            return Err(PluginError::invalid_input("spec_rollback without spec_begin"));
        }
        // The oldest round settles; younger ones were built on all of it.
        let round = self.rounds.remove(0);
        self.rounds.clear();
        let start = round.start;
        let rows = self.state.rows();
        if keep.len() != 1 && keep.len() != rows {
            return Err(PluginError::invalid_input(format!(
                "spec_rollback: {} keep counts for {rows} rows",
                keep.len()
            )));
        }
        let kept_all = (0..rows).all(|r| {
            let appended = self.state.offsets[r].saturating_sub(start.offsets.get(r).copied().unwrap_or(0));
            keep[r.min(keep.len() - 1)] >= appended
        });
        if !kept_all {
            // A state cannot drop its last tokens: back to the round's start;
            // the host replays the kept ones, every row's in one forward
            // whose columns past a row's count are padding for that row.
            let counts: Vec<u64> = (0..rows)
                .map(|r| {
                    let appended = self.state.offsets[r].saturating_sub(start.offsets.get(r).copied().unwrap_or(0));
                    keep[r.min(keep.len() - 1)].min(appended)
                })
                .collect();
            if counts.iter().any(|&n| n > 0) && start.padding_pending() {
                return Err(PluginError::invalid_input(
                    "state-recurrent: a speculative round cannot keep tokens while left padding is pending",
                ));
            }
            if let Some(p) = round.positions.filter(|p| p.complete() && counts.iter().all(|&n| n as usize <= p.width()))
            {
                self.state = p.settle(&start, &counts, &self.shapes).map_err(plugin_sdk::mlx_error)?;
                return Ok(());
            }
            self.state = start;
            self.state.replay = counts.iter().any(|&n| n > 0).then_some(counts);
        }
        Ok(())
    }

    /// Exports need a settled state: between a restoring rollback and its
    /// replay the state lacks the kept tokens its offsets will count.
    fn settled(&self) -> std::result::Result<(), PluginError> {
        match self.state.replay {
            Some(_) => Err(PluginError::invalid_input(
                "state-recurrent: the state awaits the replay of kept tokens; it cannot be exported yet",
            )),
            None => Ok(()),
        }
    }

    fn begin_padded(&mut self, pads: &[u32]) -> std::result::Result<(), PluginError> {
        if self.state.slots.iter().any(Option::is_some) || self.state.offsets.iter().any(|&o| o > 0) {
            return Err(PluginError::invalid_input("state-recurrent: begin_padded on a cache that holds tokens"));
        }
        self.state = State::padded(self.shapes.len(), pads);
        self.rounds.clear();
        Ok(())
    }

    fn merge(&mut self, rows: Vec<CacheState>) -> std::result::Result<(), PluginError> {
        let states = rows.into_iter().map(|s| self.import(s)).collect::<std::result::Result<Vec<_>, _>>()?;
        self.state.append(states, &self.shapes).map_err(plugin_sdk::mlx_error)
    }
}

impl CacheLayout for Recurrent {
    fn signature(&self) -> RString {
        quietly(RString::new(), || Recurrent::signature(self))
    }

    fn offset(&self) -> u64 {
        quietly(0, || self.state.offsets.iter().copied().max().unwrap_or(0))
    }

    /// The token count only: a recurrent layer has no positions.
    fn positions(&self) -> PResult<Positions> {
        guard(|| {
            Ok(Positions { offset: self.state.offsets.iter().copied().max().unwrap_or(0), per_row: ROption::RNone })
        })
    }

    /// `ARRAY` with bool `[B, queries]` (true = real column) while left
    /// padding or a replay of unequal counts is pending, else `NONE`.
    fn attention_mask(&self, queries: u32) -> PResult<AttentionMask> {
        guard(|| {
            Ok(match self.state.mask(queries as usize) {
                Some(m) => AttentionMask { mode: MaskMode::ARRAY, array: ROption::RSome(into_tensor(m)) },
                None => AttentionMask { mode: MaskMode::NONE, array: ROption::RNone },
            })
        })
    }

    fn update_and_fetch(&mut self, keys: Tensor, values: Tensor) -> PResult<KvPair> {
        guard_mlx(|| {
            drop(values);
            let plain = self.state.replay.is_none() && !self.state.padding_pending();
            let inputs = into_array(keys);
            let width = inputs.shape().get(1).copied().unwrap_or(0) as usize;
            let window = self.fetch(inputs)?;
            if let Some(r) = self.rounds.last_mut() {
                r.positions = (plain && !r.updated).then(|| RoundStates::new(window.clone(), width, self.shapes.len()));
                r.updated = true;
            }
            Ok(KvPair { keys: into_tensor(window.clone()), values: into_tensor(window) })
        })
    }

    fn is_trimmable(&self) -> bool {
        false
    }

    fn trim(&mut self, _n: u64) -> u64 {
        0
    }

    fn bytes_per_token(&self) -> u64 {
        0
    }

    fn export_state(&self) -> PResult<CacheState> {
        guard(|| {
            self.settled()?;
            Ok(self.export(&self.state))
        })
    }

    fn import_state(&mut self, state: CacheState) -> PResult<()> {
        guard(|| {
            self.state = self.import(state)?;
            self.rounds.clear();
            Ok(())
        })
    }

    fn spec_begin(&mut self) -> PResult<()> {
        guard(|| {
            self.rounds.push(Round { start: self.state.clone(), updated: false, positions: None });
            Ok(())
        })
    }

    /// Settles the oldest open round.
    fn spec_commit(&mut self) -> PResult<()> {
        guard(|| {
            if !self.rounds.is_empty() {
                self.rounds.remove(0);
            }
            Ok(())
        })
    }

    fn spec_rollback(&mut self, keep: RSlice<'_, u64>) -> PResult<()> {
        guard(|| self.rollback(keep.as_slice()))
    }

    fn rows(&self) -> u32 {
        quietly(0, || self.state.rows() as u32)
    }

    fn filter_rows(&mut self, keep: RSlice<'_, u32>) -> PResult<()> {
        guard_mlx(|| self.state.filter(keep.as_slice()))
    }

    fn extract_row(&self, row: u32) -> PResult<CacheState> {
        guard(|| {
            self.settled()?;
            let row = self.state.row(row as usize).map_err(plugin_sdk::mlx_error)?;
            Ok(self.export(&row))
        })
    }

    fn merge_rows(&mut self, rows: RVec<CacheState>) -> PResult<()> {
        guard(|| self.merge(rows.into_vec()))
    }

    fn get_slot(&self, i: u32) -> PResult<ROption<Tensor>> {
        guard(|| {
            let i = self.slot_index(i)?;
            Ok(self.state.slots[i].clone().map(into_tensor).into())
        })
    }

    fn set_slot(&mut self, i: u32, value: Tensor) -> PResult<()> {
        guard(|| {
            let i = self.slot_index(i)?;
            let a = into_array(value);
            let want = self.full_shape(i, self.state.rows());
            if a.shape() != want.as_slice() {
                return Err(PluginError::invalid_input(format!(
                    "state-recurrent: slot {i} must be {want:?}, got {:?}",
                    a.shape()
                )));
            }
            self.state.slots[i] = Some(a);
            Ok(())
        })
    }

    fn begin_padded(&mut self, pads: RSlice<'_, u32>) -> PResult<()> {
        guard(|| Recurrent::begin_padded(self, pads.as_slice()))
    }

    fn wants_position_states(&self) -> bool {
        quietly(false, || self.rounds.last().is_some_and(|r| r.positions.is_some()))
    }

    fn set_position_states(&mut self, i: u32, states: Tensor) -> PResult<()> {
        guard(|| {
            let i = self.slot_index(i)?;
            let rows = self.state.rows();
            let mut want = self.full_shape(i, rows);
            let Some(p) = self.rounds.last_mut().and_then(|r| r.positions.as_mut()) else {
                return Err(PluginError::invalid_input(
                    "state-recurrent: position states outside a speculative round's first update",
                ));
            };
            want.insert(1, p.width() as i32);
            p.set(i, into_array(states), &want).map_err(|e| PluginError::invalid_input(e.what()))
        })
    }

    fn rolls_back_in_place(&self) -> bool {
        quietly(false, || self.rounds.first().and_then(|r| r.positions.as_ref()).is_some_and(RoundStates::complete))
    }
}

#[cfg(test)]
mod tests;
