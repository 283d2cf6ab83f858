//! The eviction round's accounting: when a round starts, what it has left to free, and what
//! the driver does after each of its steps (send the drops of some owners, set the gauges,
//! end the round). The evictions themselves are the driver's.

use super::state::{CoreState, Round};

/// Objects an eviction round evicts between two sends of its drops to the same owner (and at
/// its end): with 64 owners, about 64 drops a message, where sent after each step (one or two
/// an owner) the messages and their acknowledgements, not the eviction, made the round's cost.
/// The owners take turns: each step sends to its share of them (those waiting longest), so the
/// messages and acknowledgements go out evenly through the round; sent to every owner at once
/// every 4096 objects, each such burst held up the calls arriving meanwhile (the single-key
/// p99 of a 10 M-object store while a round ran rose from 3.5-3.9 ms to 4.6-5.2 ms; see
/// docs/src/benchmarks.md). Ranges wait in quarantine until their drop is acknowledged, so a
/// longer wait delays their reuse; a put that finds no room sends every queued drop at once
/// (`Master::evict_in`), and so does each sweep.
pub const EVICTION_NEWS_BATCH: u64 = 4096;

/// What the driver does after a step of a round ([`end_step`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum AfterStep {
    /// The round goes on: the `turns` links waiting longest get their drops; `gauges`: the
    /// step crossed an [`EVICTION_NEWS_BATCH`] of the round's objects, set the gauges.
    More { turns: usize, gauges: bool },
    /// The round is over (what it did): every drop queued goes, the gauges are set.
    Done(Round),
    /// No round any more (a new term meanwhile): every drop queued goes.
    Gone,
}

/// The bytes the round under way has left to free, a round starting (toward `ratio` of the
/// memory capacity) when none is and a put found no room since the last one, or memory use
/// is above `high_watermark`; `None` when no round is due.
pub(crate) fn step_budget(core: &mut CoreState, high_watermark: f64, ratio: f64) -> Option<u64> {
    if core.round.is_none() {
        if !(std::mem::take(&mut core.pressure) || core.used_above(high_watermark)) {
            return None;
        }
        core.round = Some(Round { target: core.eviction_target(ratio), ..Round::default() });
    }
    let round = core.round.expect("set above");
    Some(round.target.saturating_sub(round.freed))
}

/// Accounts a step that evicted `count` objects freeing `freed` bytes, with `waiting` links
/// holding drops of the round: what the driver does next.
pub(crate) fn end_step(core: &mut CoreState, freed: u64, count: u64, waiting: usize) -> AfterStep {
    let Some(round) = core.round.as_mut() else {
        return AfterStep::Gone;
    };
    (round.freed, round.count) = (round.freed + freed, round.count + count);
    if count == 0 || round.freed >= round.target {
        return AfterStep::Done(core.round.take().expect("looked up above"));
    }
    // The gauges are set every EVICTION_NEWS_BATCH objects of the round, and at its end.
    let gauges = round.count / EVICTION_NEWS_BATCH != (round.count - count) / EVICTION_NEWS_BATCH;
    round.owed += count * waiting as u64;
    let turns = round.owed / EVICTION_NEWS_BATCH;
    round.owed %= EVICTION_NEWS_BATCH;
    AfterStep::More { turns: turns as usize, gauges }
}
