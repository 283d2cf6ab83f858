//! The master's core: its state and the logic over it, with no lock, channel, thread or clock
//! of its own, in the style of a sans-IO protocol core. Each function takes the state it works
//! on (`&CoreState`, `&mut CoreState`, an object) and the time `now` as arguments and returns
//! what it decided; the driver ([`super::Master`]) reads the clock, holds the locks and turns
//! the results into owner news, events and metrics.
//!
//! * [`state`]: segments, clients, versions;
//! * [`limits`]: what a request is checked against;
//! * [`puts`]: a put's object record, its replicas as read, the reclaim of stale puts;
//! * [`rounds`]: the eviction round's accounting;
//! * [`load`]: the per-segment rates of gets and puts;
//! * [`views`]: the answers built from the state (replica lists, totals, segment views).

pub(crate) mod limits;
pub(crate) mod load;
pub(crate) mod puts;
pub(crate) mod rounds;
pub(crate) mod state;
pub(crate) mod views;
