//! The net layer every listener and every control connection of Crescent uses: one frame
//! codec and one accept loop, so that bounds, deadlines and (later) authentication are
//! written once.
//!
//! * [`wire`]: byte streams read and written against a deadline — a whole frame has one
//!   deadline, not one per partial read or write, so a peer that trickles bytes or stops
//!   reading cannot hold a thread longer than the frame's time;
//! * [`codec`]: a frame [`Format`] (magic, version, kind, header length, a payload cap checked
//!   before anything is allocated) and reading/writing length-prefixed frames with deadlines;
//!   the tcp transport, the shm and rdma control messages, the engine's handshake and the
//!   store's disk service are its formats;
//! * [`serve`](mod@serve): the accept loop: connections bounded in total and per peer (address, or pid
//!   for a same-host peer), backoff on accept errors (`EMFILE`, `ENFILE`, ...), a connection
//!   count that a failed thread start cannot leak, and a clean shutdown.
//!
//! * [`auth`]: with a cluster secret, the mutual challenge-response every connection goes
//!   through before its first frame: in [`serve::serve`]'s connection setup, before the
//!   handler sees a byte, and in every dialer's connect ([`Auth::dial`]) — once, for every port.

pub mod auth;
pub mod codec;
pub mod serve;
pub mod wire;

pub use auth::{Auth, AuthError, AuthStats, Guard, Keyring, Service};
pub use codec::{Format, FrameError, RawFrame};
pub use serve::{serve, Limits, PeerKey, Server};
pub use wire::Wire;
