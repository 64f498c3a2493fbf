//! Cohort prefill: requests that arrive together prefill as ONE left-padded
//! `[B, L]` batch instead of one after another, so a burst of clients gets
//! its first tokens after one pass over the device rather than B passes.
//!
//! The caches are told each row's padding before the first chunk
//! (`CacheLayout::begin_padded`); positions and masks then hide the padding
//! exactly as they do for rows merged later. Chunks run over columns, at
//! most `prefill_step / B` at a time, so running rows still wait at most
//! about one serial chunk's worth of work between decode steps.
//!
//! Members with the same head (the choices of one `n` > 1 request, or
//! identical prompts) prefill it ONCE: the cohort's caches hold one row per
//! distinct head, and each member lands from that row's state. Layouts that
//! share by reference (kv-paged) then hold one copy for all of them.
//!
//! Members that share a prefix already in the prefix cache (a chat
//! template's opening, a system prompt) start from it: every column left of
//! `start` comes from the cache. Row r is padded by `p_r` columns and holds
//! `C_r` cached tokens, so its first `start - p_r` tokens are cached when
//! `start <= p_r + C_r`; the columns from `start` on are computed as before,
//! and for a shorter row those include the last `C_r - (start - p_r)`
//! cached tokens, in the slots its padding would otherwise have taken. So a
//! seeded cohort computes no column that an unseeded one would not. Each
//! row's cached tokens are trimmed to its share and merged left-padded
//! (`merge_rows`), which is the padding `begin_padded` would have set.

use crate::engine::Engine;
use crate::error::EngineError;
use plugin_api::abi_stable::std_types::{RSlice, RVec};
use plugin_api::CacheBox;

/// A cohort's shared prefill state.
pub struct Cohort {
    /// Batch caches, one row per distinct head, left-padded to the longest.
    pub caches: Vec<CacheBox>,
    /// Each distinct head (a member's prompt minus its last token: what
    /// prefill covers), in the order first met.
    heads: Vec<Vec<u32>>,
    /// Each member's row in `caches`.
    row_of: Vec<usize>,
    pads: Vec<usize>,
    /// Columns of the padded `[B, width]` token matrix already prefilled.
    done: usize,
    width: usize,
    /// Tokens of each row that came from the prefix cache.
    seeded: Vec<usize>,
}

/// Which of the candidates (lengths to compute, in arrival order) prefill
/// together: the first one and every later one within a factor of two of
/// its length or `SLACK` columns of it, so padding never exceeds half of the
/// computed columns or `SLACK` columns a row. Fewer than two members is no
/// cohort.
pub fn choose(lengths: &[usize]) -> Vec<usize> {
    let Some(&anchor) = lengths.first() else { return Vec::new() };
    if anchor == 0 {
        return Vec::new();
    }
    let near = |n: usize| (n <= anchor * 2 && n * 2 >= anchor) || n.abs_diff(anchor) <= SLACK;
    let picked: Vec<usize> = lengths.iter().enumerate().filter(|&(_, &n)| n > 0 && near(n)).map(|(i, _)| i).collect();
    if picked.len() < 2 {
        Vec::new()
    } else {
        picked
    }
}

/// Padding columns a row may take beyond the factor of two: a few columns
/// more cost less than another pass over the weights for short prompts.
const SLACK: usize = 16;

/// A member: its head, and the caches holding the part of it the prefix
/// cache had (`cached` tokens; trimmed when the cohort starts from them).
pub struct Member<'a> {
    pub head: Vec<u32>,
    pub cached: usize,
    pub caches: &'a mut [CacheBox],
}

/// What a row brings to the start: tokens cached, and whether its caches
/// can give up the ones past its share.
#[derive(Clone, Copy, Debug)]
pub struct Seed {
    pub cached: usize,
    pub trimmable: bool,
}

/// The first column computed when rows padded by `pads` hold what `seeds`
/// say: the furthest column every row has cached up to, provided each row
/// keeps at least one cached token there (a row of padding alone cannot be
/// merged) and a row that must give up cached tokens can. None: the cohort
/// starts empty.
pub fn seeded_start(pads: &[usize], seeds: &[Seed]) -> Option<usize> {
    let start = pads.iter().zip(seeds).map(|(p, s)| p + s.cached).min()?;
    let fits = |(p, s): (&usize, &Seed)| *p < start && (s.trimmable || s.cached == start - p);
    (start > 0 && pads.iter().zip(seeds).all(fits)).then_some(start)
}

/// The distinct heads of `heads` in the order first met, and each one's
/// row among them.
fn distinct<'h>(heads: impl Iterator<Item = &'h [u32]>) -> (Vec<&'h [u32]>, Vec<usize>) {
    let mut rows: Vec<&[u32]> = Vec::new();
    let row_of = heads
        .map(|h| match rows.iter().position(|u| *u == h) {
            Some(r) => r,
            None => {
                rows.push(h);
                rows.len() - 1
            }
        })
        .collect();
    (rows, row_of)
}

/// The padding of each distinct head, left-aligned to the longest.
fn pads_of(rows: &[&[u32]]) -> Vec<usize> {
    let width = rows.iter().map(|h| h.len()).max().unwrap_or(0);
    rows.iter().map(|h| width - h.len()).collect()
}

/// The column a cohort of members with these heads and seeds starts
/// computing at (`seeded_start`; the first member with a head speaks for
/// it), or None when it starts empty.
pub fn start_column<'h>(members: impl Iterator<Item = (&'h [u32], Seed)>) -> Option<usize> {
    let (heads, seeds): (Vec<&[u32]>, Vec<Seed>) = members.unzip();
    let (rows, row_of) = distinct(heads.into_iter());
    seeded_start(&pads_of(&rows), &first_per_row(&row_of, seeds))
}

/// Of `items` (one per member, in member order), each row's first: the
/// member that brought the row's head (`distinct` numbers rows in the
/// order first met).
fn first_per_row<T>(row_of: &[usize], items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut firsts = Vec::new();
    for (m, item) in items.into_iter().enumerate() {
        if row_of[m] == firsts.len() {
            firsts.push(item);
        }
    }
    firsts
}

/// A member's seed: its cached tokens, and whether all its caches trim.
pub fn seed_of(cached: usize, caches: &[CacheBox]) -> Seed {
    Seed { cached, trimmable: caches.iter().all(|c| c.is_trimmable()) }
}

impl Cohort {
    /// Padded caches for these members, started from their cached tokens
    /// where every row can be (`start_column`), else empty; `None` when a
    /// layout cannot start padded rows (the caller then prefills one at a
    /// time).
    pub fn start(engine: &Engine, members: Vec<Member>) -> Result<Option<Self>, EngineError> {
        let start = start_column(members.iter().map(|m| (m.head.as_slice(), seed_of(m.cached, m.caches))));
        let (rows, row_of) = distinct(members.iter().map(|m| m.head.as_slice()));
        let heads: Vec<Vec<u32>> = rows.iter().map(|h| h.to_vec()).collect();
        let pads = pads_of(&rows);
        let width = heads.iter().map(Vec::len).max().unwrap_or(0);
        if let Some(start) = start {
            // The first member with each head brings its cached tokens.
            let mut seeds = first_per_row(&row_of, members);
            let caches = merge_seeds(engine, &mut seeds, &pads, start)?;
            let seeded = pads.iter().map(|p| start - p).collect();
            return Ok(Some(Self { caches, heads, row_of, pads, done: start, width, seeded }));
        }
        let mut caches = engine.model().new_caches(0)?;
        let p32: Vec<u32> = pads.iter().map(|&p| p as u32).collect();
        for c in caches.iter_mut() {
            if c.begin_padded(RSlice::from_slice(&p32)).into_result().is_err() {
                return Ok(None);
            }
        }
        let seeded = vec![0; heads.len()];
        Ok(Some(Self { caches, heads, row_of, pads, done: 0, width, seeded }))
    }

    /// Tokens of member `m`'s head that came from the prefix cache.
    pub fn seeded(&self, m: usize) -> usize {
        self.seeded[self.row_of[m]]
    }

    /// Rows the caches hold (distinct heads).
    pub fn rows(&self) -> usize {
        self.heads.len()
    }

    /// Whether every member has a row of its own (no head repeats): the
    /// caches can then become the batch as they are.
    pub fn one_row_per_member(&self) -> bool {
        self.row_of.len() == self.heads.len()
    }

    /// Whether member `m` is the first with its head (the one whose state
    /// the prefix cache gets).
    pub fn first_with_its_head(&self, m: usize) -> bool {
        self.row_of.iter().position(|&r| r == self.row_of[m]) == Some(m)
    }

    /// Runs the next chunk of columns; true once every head is in.
    pub fn advance(&mut self, engine: &Engine) -> Result<bool, EngineError> {
        if self.done >= self.width {
            // Every head came whole from the prefix cache.
            return Ok(true);
        }
        let b = self.rows();
        let cols = (engine.prefill_step() / b).max(32).min(self.width - self.done);
        let mut ids = Vec::with_capacity(b * cols);
        for (h, &pad) in self.heads.iter().zip(&self.pads) {
            for c in self.done..self.done + cols {
                // Padding columns carry the row's first token: any valid id
                // works, the mask hides them from every real query.
                ids.push(if c < pad { h[0] } else { h[c - pad] });
            }
        }
        let input = crate::tensors::token_array(&ids).reshape(&[b as i32, cols as i32])?;
        engine.prefill_chunk(&input, &mut self.caches)?;
        self.done += cols;
        Ok(self.done >= self.width)
    }

    /// The 1-row state of member `m` (prefix cache, merging into a batch).
    pub fn row_state(&self, m: usize) -> Result<Vec<plugin_api::CacheState>, EngineError> {
        self.caches.iter().map(|c| extract(c, self.row_of[m])).collect()
    }

    /// Member `m`'s state in layer `layer`'s cache.
    pub fn layer_row_state(&self, layer: usize, m: usize) -> Result<plugin_api::CacheState, EngineError> {
        extract(&self.caches[layer], self.row_of[m])
    }

    pub fn head(&self, m: usize) -> &[u32] {
        &self.heads[self.row_of[m]]
    }
}

/// Each row's cached tokens cut to its share, merged left-padded into fresh
/// batch caches, layer by layer.
fn merge_seeds(
    engine: &Engine,
    seeds: &mut [Member],
    pads: &[usize],
    start: usize,
) -> Result<Vec<CacheBox>, EngineError> {
    for (m, p) in seeds.iter_mut().zip(pads) {
        let excess = (m.cached - (start - p)) as u64;
        for c in m.caches.iter_mut() {
            if excess > 0 && c.trim(excess) != excess {
                return Err(EngineError::Model("a cached prefix could not be trimmed to its cohort share".into()));
            }
        }
    }
    let mut caches = engine.model().new_caches(0)?;
    for (l, batch) in caches.iter_mut().enumerate() {
        let states = seeds
            .iter()
            .map(|m| m.caches[l].export_state().into_result())
            .collect::<Result<RVec<_>, _>>()
            .map_err(|e| EngineError::Model(format!("export_state: {e}")))?;
        batch.merge_rows(states).into_result().map_err(|e| EngineError::Model(format!("merge_rows: {e}")))?;
    }
    Ok(caches)
}

fn extract(c: &CacheBox, row: usize) -> Result<plugin_api::CacheState, EngineError> {
    c.extract_row(row as u32).into_result().map_err(|e| EngineError::Model(format!("extract_row: {e}")))
}

#[cfg(test)]
mod tests {
    use super::{choose, seeded_start, start_column, Seed};

    #[test]
    fn a_cohort_starts_where_every_row_has_cached_up_to() {
        let trim = |c: &[usize]| c.iter().map(|&cached| Seed { cached, trimmable: true }).collect::<Vec<_>>();
        // Heads of 19, 17 and 14 tokens sharing 12 cached: the longest row
        // is cached to column 12, the others (padded 2 and 5) beyond it.
        assert_eq!(seeded_start(&[0, 2, 5], &trim(&[12, 12, 12])), Some(12));
        assert_eq!(seeded_start(&[0, 2, 5], &trim(&[12, 3, 12])), None, "row 2 is all padding up to column 5");
        assert_eq!(seeded_start(&[0, 2], &trim(&[6, 3])), Some(5));
        assert_eq!(seeded_start(&[0, 5], &trim(&[4, 4])), None, "a row padded past the start would be padding alone");
        assert_eq!(seeded_start(&[0, 0], &trim(&[0, 9])), None, "nothing cached in a row");
        assert_eq!(seeded_start(&[], &[]), None);
        // A row that cannot trim must hold exactly its share.
        let fixed = |cached| Seed { cached, trimmable: false };
        assert_eq!(seeded_start(&[0, 2], &[fixed(6), fixed(4)]), Some(6));
        assert_eq!(seeded_start(&[0, 2], &[fixed(6), fixed(5)]), None, "row 1 would give up a token it cannot");
    }

    #[test]
    fn repeated_heads_count_once_in_the_start() {
        let seed = |cached| Seed { cached, trimmable: true };
        let (a, b): (Vec<u32>, Vec<u32>) = ((0..10).collect(), (0..8).collect());
        // The repeat of a brings a seed the start would refuse; only the
        // first with its head speaks for it.
        let members = [(&a[..], seed(6)), (&b[..], seed(6)), (&a[..], seed(0))];
        assert_eq!(start_column(members.into_iter()), Some(6));
        assert_eq!(start_column([(&a[..], seed(6)), (&b[..], seed(0))].into_iter()), None, "b has nothing cached");
    }

    #[test]
    fn members_are_within_a_factor_of_two_of_the_first_or_a_few_columns() {
        assert_eq!(choose(&[100, 60, 201, 50, 200, 10]), vec![0, 1, 3, 4]);
        assert_eq!(choose(&[100, 10, 300]), Vec::<usize>::new(), "alone is no cohort");
        assert_eq!(choose(&[2, 7, 18, 19, 1]), vec![0, 1, 2, 4], "short ones within 16 columns");
        assert_eq!(choose(&[0, 0]), Vec::<usize>::new(), "nothing to prefill");
        assert_eq!(choose(&[]), Vec::<usize>::new());
    }
}
