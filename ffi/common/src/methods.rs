//! The store methods of both bindings as one table: a row per method ([`Method`]) says which
//! op its arguments become ([`OpKind`]), whether its keys run as one batched call, what the
//! binding must check first, and how the outcomes become its return shape ([`Reply`]).
//!
//! A binding parses its own argument types (Python objects, C pointers) into keys and
//! [`Mem`]s, makes the ops with [`Method::op`] and runs them with [`run`]; what comes back,
//! an [`Answer`], becomes the method's return value by the row's [`Reply`]. The preamble every
//! call shares (last error, set-up check, GIL release) is the binding's, written once.
//!
//! Adding a Mooncake method that reuses existing ops is a row here plus its binding's
//! one-line stub (its signature) and a test.

use crescent_store::client::{Batch, Buffer, Dest, Op, Outcome, Source};
use crescent_store::proto::PutOptions;
use crescent_store::{StoreApi, StoreError, ValueSink};

use crate::{fail, store_status, Status};

/// The op a method's arguments become, one per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// [`Op::Get`] into the memory the argument gives.
    Get,
    /// [`Op::Put`] from the argument; `upsert` replaces an existing value.
    Put {
        /// Replace the key's value if it has one.
        upsert: bool,
    },
    /// [`Op::Exists`].
    Exists,
    /// [`Op::Size`].
    Size,
    /// [`Op::Remove`].
    Remove,
    /// [`Op::RemoveMatching`] (the key is the pattern).
    RemoveMatching,
    /// [`Op::RemoveAll`] (no key).
    RemoveAll,
}

/// How a method's outcomes become its return value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// One op: 0, a size, a count or 1/0, else a negative code.
    Int,
    /// 0 when every op succeeded, else the first op's code.
    FirstError,
    /// A code (or size, or 1/0) per op; an error of the whole call for every op.
    Ints,
    /// The outcomes themselves (bytes, held buffers): the binding shapes them.
    Values,
}

/// What a method does with a put whose value has no bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Empty {
    /// Hands it to the store (which answers for it).
    Store,
    /// Mooncake's "Attempting to put empty data": a warning and a success, nothing stored.
    Success,
}

/// One store method of a binding.
#[derive(Debug, Clone, Copy)]
pub struct Method {
    /// Its name (Mooncake's, or the C function's), in messages.
    pub name: &'static str,
    /// The op of each key.
    pub kind: OpKind,
    /// The keys in one batched call (one master round trip) rather than a call each.
    pub batch: bool,
    /// It moves bytes through the client's local buffer (refused when set up without one).
    pub local_buffer: bool,
    /// What a put of no bytes does.
    pub empty: Empty,
    /// The status of a buffer too small for the value.
    pub too_small: Status,
    /// Before set-up: the reply is empty (`[]`) rather than a code per key.
    pub unset_empty: bool,
    /// Its return shape.
    pub reply: Reply,
}

/// A method row with the common choices: one call per key, no local buffer, empty values
/// handed to the store, `BUFFER_OVERFLOW` for a buffer too small, one code back.
const fn row(name: &'static str, kind: OpKind) -> Method {
    Method {
        name,
        kind,
        batch: false,
        local_buffer: false,
        empty: Empty::Store,
        too_small: Status::BufferOverflow,
        unset_empty: false,
        reply: Reply::Int,
    }
}

const PUT: OpKind = OpKind::Put { upsert: false };
const UPSERT: OpKind = OpKind::Put { upsert: true };

impl Method {
    /// This row, its keys in one batched call with `reply`.
    const fn batched(self, reply: Reply) -> Method {
        Method { batch: true, reply, ..self }
    }
    /// This row, moving bytes through the local buffer.
    const fn bytes(self) -> Method {
        Method { local_buffer: true, ..self }
    }
    /// This row, a put of no bytes a success.
    const fn empty_ok(self) -> Method {
        Method { empty: Empty::Success, ..self }
    }
    /// This row with `reply`.
    const fn replies(self, reply: Reply) -> Method {
        Method { reply, ..self }
    }

    /// The op of `key` with `mem` (what the row's kind takes: the source of a put, the
    /// destination of a get, nothing for the others; `force` for the removes).
    pub fn op<'a>(&self, key: &'a str, mem: Mem<'a>, force: bool) -> Op<'a> {
        match self.kind {
            OpKind::Get => Op::Get { key, into: mem.into_dest() },
            OpKind::Put { upsert } => Op::Put { key, from: mem.into_source(), upsert },
            OpKind::Exists => Op::Exists { key },
            OpKind::Size => Op::Size { key },
            OpKind::Remove => Op::Remove { key, force },
            OpKind::RemoveMatching => Op::RemoveMatching { pattern: key, force },
            OpKind::RemoveAll => Op::RemoveAll { force },
        }
    }
}

/// Mooncake's store methods (the Python `MooncakeDistributedStore`'s names).
pub mod mooncake {
    use super::*;

    pub const PUT_BYTES: Method = row("put", PUT).bytes();
    pub const UPSERT_BYTES: Method = row("upsert", UPSERT).bytes();
    pub const PUT_BATCH: Method = row("put_batch", PUT).bytes().batched(Reply::FirstError);
    pub const UPSERT_BATCH: Method = row("upsert_batch", UPSERT).bytes().batched(Reply::FirstError);
    pub const PUT_PARTS: Method = row("put_parts", PUT).bytes().empty_ok();
    pub const UPSERT_PARTS: Method = row("upsert_parts", UPSERT).bytes().empty_ok();
    pub const PUT_FROM: Method = row("put_from", PUT).empty_ok();
    pub const UPSERT_FROM: Method = row("upsert_from", UPSERT).empty_ok();
    pub const BATCH_PUT_FROM: Method = row("batch_put_from", PUT).batched(Reply::Ints);
    pub const BATCH_UPSERT_FROM: Method = row("batch_upsert_from", UPSERT).batched(Reply::Ints);
    pub const PUT_FROM_WITH_METADATA: Method = row("put_from_with_metadata", PUT);
    pub const GET: Method = row("get", OpKind::Get).bytes().replies(Reply::Values);
    pub const GET_BATCH: Method = row("get_batch", OpKind::Get).bytes().batched(Reply::Values);
    pub const GET_BUFFER: Method = row("get_buffer", OpKind::Get).bytes().replies(Reply::Values);
    pub const BATCH_GET_BUFFER: Method = row("batch_get_buffer", OpKind::Get).bytes().batched(Reply::Values);
    pub const GET_INTO: Method = row("get_into", OpKind::Get);
    pub const BATCH_GET_INTO: Method = row("batch_get_into", OpKind::Get).batched(Reply::Ints);
    pub const IS_EXIST: Method = row("is_exist", OpKind::Exists);
    pub const BATCH_IS_EXIST: Method = row("batch_is_exist", OpKind::Exists).batched(Reply::Ints);
    pub const GET_SIZE: Method = row("get_size", OpKind::Size);
    pub const REMOVE: Method = row("remove", OpKind::Remove);
    pub const BATCH_REMOVE: Method = row("batch_remove", OpKind::Remove).replies(Reply::Ints);
    pub const REMOVE_BY_REGEX: Method = row("remove_by_regex", OpKind::RemoveMatching);
    pub const REMOVE_ALL: Method = row("remove_all", OpKind::RemoveAll);
    pub const BATCH_PUT_FROM_MULTI_BUFFERS: Method =
        Method { unset_empty: true, ..row("batch_put_from_multi_buffers", PUT).batched(Reply::Ints) };
    pub const BATCH_GET_INTO_MULTI_BUFFERS: Method = Method {
        too_small: Status::InvalidParams,
        ..row("batch_get_into_multi_buffers", OpKind::Get).batched(Reply::Ints)
    };

    /// Every row, for the table's tests and docs.
    pub const ALL: &[Method] = &[
        PUT_BYTES,
        UPSERT_BYTES,
        PUT_BATCH,
        UPSERT_BATCH,
        PUT_PARTS,
        UPSERT_PARTS,
        PUT_FROM,
        UPSERT_FROM,
        BATCH_PUT_FROM,
        BATCH_UPSERT_FROM,
        PUT_FROM_WITH_METADATA,
        GET,
        GET_BATCH,
        GET_BUFFER,
        BATCH_GET_BUFFER,
        GET_INTO,
        BATCH_GET_INTO,
        IS_EXIST,
        BATCH_IS_EXIST,
        GET_SIZE,
        REMOVE,
        BATCH_REMOVE,
        REMOVE_BY_REGEX,
        REMOVE_ALL,
        BATCH_PUT_FROM_MULTI_BUFFERS,
        BATCH_GET_INTO_MULTI_BUFFERS,
    ];
}

/// The C ABI's store functions (`crescent_store_*`).
pub mod c {
    use super::*;

    pub const PUT: Method = row("crescent_store_put", super::PUT);
    pub const PUT_FROM: Method = row("crescent_store_put_from", super::PUT);
    pub const GET_INTO: Method = row("crescent_store_get_into", OpKind::Get);
    pub const BATCH_PUT_FROM: Method = row("crescent_store_batch_put_from", super::PUT).batched(Reply::Ints);
    pub const BATCH_GET_INTO: Method = row("crescent_store_batch_get_into", OpKind::Get).batched(Reply::Ints);
    pub const EXISTS: Method = row("crescent_store_exists", OpKind::Exists);
    pub const BATCH_EXISTS: Method = row("crescent_store_batch_exists", OpKind::Exists).batched(Reply::Ints);
    pub const GET_SIZE: Method = row("crescent_store_get_size", OpKind::Size);
    pub const REMOVE: Method = row("crescent_store_remove", OpKind::Remove);
    pub const REMOVE_BY_REGEX: Method = row("crescent_store_remove_by_regex", OpKind::RemoveMatching);
    pub const REMOVE_ALL: Method = row("crescent_store_remove_all", OpKind::RemoveAll);
}

/// A key's memory as a binding hands it over: what its row's op reads or writes.
pub enum Mem<'a> {
    /// No memory (exists, size, remove), or a get of a new byte vector.
    None,
    /// Plain bytes to put.
    Bytes(&'a [u8]),
    /// Plain bytes in parts to put, one after another.
    Parts(Vec<&'a [u8]>),
    /// Registered (or device) memory to put from or get into.
    Buffers(Vec<Buffer>),
    /// A get into the memory the sink makes.
    Sink(&'a mut dyn ValueSink),
    /// A get held in the client's memory.
    Held,
}

impl<'a> Mem<'a> {
    fn into_dest(self) -> Dest<'a> {
        match self {
            Mem::Buffers(b) => Dest::Buffers(b),
            Mem::Sink(s) => Dest::Sink(s),
            Mem::Held => Dest::Held,
            Mem::None | Mem::Bytes(_) | Mem::Parts(_) => Dest::Bytes,
        }
    }

    fn into_source(self) -> Source<'a> {
        match self {
            Mem::Bytes(b) => Source::Bytes(b),
            Mem::Parts(p) => Source::Parts(p),
            Mem::Buffers(b) => Source::Buffers(b),
            Mem::None | Mem::Sink(_) | Mem::Held => Source::Bytes(&[]),
        }
    }
}

/// What a method's ops gave: a status for the whole call (refused, or failed as a whole) or
/// an outcome per op, each error already turned into its status (and recorded as the last
/// error, in order).
pub struct Answer {
    /// How many keys the call had (a whole-call status stands for each).
    pub keys: usize,
    /// `Err`: the whole call's status (`Status::Ok` for a call answered early with success).
    pub whole: Result<(), Status>,
    /// Per op, its outcome or status.
    pub each: Vec<Result<Outcome, Status>>,
}

impl Answer {
    /// The whole call answered with `status` before anything ran.
    pub fn refused(keys: usize, status: Status) -> Answer {
        Answer { keys, whole: Err(status), each: Vec::new() }
    }

    /// The answer as one value ([`Reply::Int`], [`Reply::FirstError`]).
    pub fn int(&self, m: &Method) -> i64 {
        match (&self.whole, m.reply) {
            (Err(s), _) => s.code() as i64,
            (Ok(()), Reply::FirstError) => self.each.iter().map(int).find(|&c| c != 0).unwrap_or(0),
            (Ok(()), _) => self.each.first().map_or(0, int),
        }
    }

    /// The answer as one value per key ([`Reply::Ints`]).
    pub fn ints(&self) -> Vec<i64> {
        match self.whole {
            Err(s) => vec![s.code() as i64; self.keys],
            Ok(()) => self.each.iter().map(int).collect(),
        }
    }
}

/// An op's outcome as Mooncake's integer: 0 done, a size or count, 1/0, or a negative code.
pub fn int(r: &Result<Outcome, Status>) -> i64 {
    match r {
        Ok(Outcome::Size(n) | Outcome::Count(n)) => *n as i64,
        Ok(Outcome::Exists(b)) => i64::from(*b),
        Ok(Outcome::Done | Outcome::Bytes(_) | Outcome::Held(_)) => 0,
        Err(s) => s.code() as i64,
    }
}

/// The status of `e` for method `m`, recorded as the last error.
fn status_of(m: &Method, e: &StoreError) -> Status {
    let status = match e {
        StoreError::BufferTooSmall { .. } => m.too_small,
        e => store_status(e),
    };
    fail(status, e)
}

/// Runs method `m`'s ops on `client` with `options`: the ops refused already (a binding's
/// argument checks) keep their status; the others run as one [`Batch`] (batched when the row
/// says so). A put of no bytes is a success without a call when the row says so.
pub fn run(client: &dyn StoreApi, m: &Method, ops: Vec<Result<Op<'_>, Status>>, options: PutOptions) -> Answer {
    let keys = ops.len();
    if m.empty == Empty::Success && !m.batch && ops.iter().all(|op| op.as_ref().is_ok_and(is_empty_put)) && keys > 0 {
        // Mooncake: "Attempting to put empty data" is a warning and a success.
        tracing::warn!("{}: empty value; nothing stored", m.name);
        return Answer::refused(keys, Status::Ok);
    }
    let mut each: Vec<Option<Result<Outcome, Status>>> = Vec::with_capacity(keys);
    let mut accepted = Vec::with_capacity(keys);
    for op in ops {
        match op {
            Ok(op) => {
                each.push(None);
                accepted.push(op);
            }
            Err(s) => each.push(Some(Err(s))),
        }
    }
    if accepted.is_empty() {
        return Answer { keys, whole: Ok(()), each: each.into_iter().flatten().collect() };
    }
    let batch =
        if m.batch { Batch::together(accepted, options) } else { Batch { ops: accepted, options, together: false } };
    match client.run(batch) {
        Err(e) => Answer { keys, whole: Err(status_of(m, &e)), each: Vec::new() },
        Ok(outcomes) => {
            let mut outcomes = outcomes.into_iter();
            let each = each
                .into_iter()
                .map(|slot| match slot {
                    Some(refused) => refused,
                    None => match outcomes.next() {
                        Some(Ok(o)) => Ok(o),
                        Some(Err(e)) => Err(status_of(m, &e)),
                        None => Err(fail(Status::Internal, format!("{}: an op without an outcome", m.name))),
                    },
                })
                .collect();
            Answer { keys, whole: Ok(()), each }
        }
    }
}

/// A put of no bytes at all.
fn is_empty_put(op: &Op<'_>) -> bool {
    match op {
        Op::Put { from: Source::Bytes(b), .. } => b.is_empty(),
        Op::Put { from: Source::Parts(p), .. } => p.iter().all(|b| b.is_empty()),
        Op::Put { from: Source::Buffers(b), .. } => b.iter().all(|b| b.len == 0),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mooncake_row_has_its_own_name() {
        let mut names: Vec<&str> = mooncake::ALL.iter().map(|m| m.name).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn answers_take_the_rows_shape() {
        let ok = |o| Ok::<Outcome, Status>(o);
        let a = Answer {
            keys: 3,
            whole: Ok(()),
            each: vec![ok(Outcome::Done), Err(Status::ObjectNotFound), Err(Status::InvalidParams)],
        };
        assert_eq!(a.int(&mooncake::PUT_BATCH), Status::ObjectNotFound.code() as i64);
        assert_eq!(a.ints(), vec![0, -704, -600]);
        let a = Answer { keys: 2, whole: Ok(()), each: vec![ok(Outcome::Exists(true)), ok(Outcome::Size(7))] };
        assert_eq!(a.ints(), vec![1, 7]);
        let refused = Answer::refused(2, Status::RpcFail);
        assert_eq!(refused.ints(), vec![-900, -900]);
        assert_eq!(refused.int(&mooncake::GET_INTO), -900);
        assert_eq!(Answer::refused(1, Status::Ok).int(&mooncake::PUT_FROM), 0);
    }

    #[test]
    fn rows_make_their_ops() {
        let op = mooncake::BATCH_GET_INTO.op("k", Mem::Buffers(vec![Buffer::host(8, 4)]), false);
        assert!(matches!(op, Op::Get { key: "k", into: Dest::Buffers(ref b) } if b.len() == 1));
        let op = mooncake::UPSERT_FROM.op("k", Mem::Buffers(Vec::new()), false);
        assert!(matches!(op, Op::Put { upsert: true, .. }));
        assert!(is_empty_put(&op));
        assert!(matches!(mooncake::BATCH_REMOVE.op("k", Mem::None, true), Op::Remove { force: true, .. }));
    }
}
