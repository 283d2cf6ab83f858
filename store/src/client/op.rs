//! A store operation as data: [`Op`] (get, put, exists, remove, ...) with typed sources and
//! destinations, a [`Batch`] of them with its put options, and the one entry point that runs
//! a batch, [`StoreApi::run`](crate::StoreApi::run), giving one [`Outcome`] per op.
//!
//! Memory is a scatter/gather list of [`Buffer`]s, each tagged with where it lives
//! ([`Memory::Host`], or [`Memory::Cuda`] for a GPU's memory), registered with
//! `register_buffer` either way. Where a buffer lives is what its registration says (the
//! driver's pointer attributes); a buffer tagged [`Memory::Cuda`] that is not registered memory
//! of that GPU is refused alone with [`StoreError::DeviceMemory`]. Device memory moves as host
//! memory does, except that the client never touches it with the CPU (see the device memory
//! page of the book).
//!
//! A batch runs its ops either one call each ([`Batch::one`]), or, made with
//! [`Batch::together`], consecutive ops of one kind as one batched call (one master round
//! trip, one engine batch). The executor (in `api.rs`, beside the trait it calls) maps each
//! kind onto the [`StoreApi`](crate::StoreApi) calls, so the full client and the dummy client
//! run the same ops, and the bindings (`ffi/common`'s method table) build ops instead of
//! calling the methods one by one. This module holds data only and imports no other part of
//! the client.

use std::mem::MaybeUninit;

use crate::error::{Result, StoreError};
use crate::proto::PutOptions;

/// Where whole values go once their sizes are known (`batch_get_into_placed`): given each
/// key's size (`None` where it has no value), an address of registered memory per key, or
/// `None` to skip it.
pub type Placer<'a> = dyn FnMut(&[Option<u64>]) -> crate::error::Result<Vec<Option<u64>>> + 'a;

/// Memory that holds one value for its owner until dropped (what `get_buffer` returns).
pub trait Held: Send + Sync {
    /// The value's first byte, a virtual address of this process.
    fn addr(&self) -> u64;
    /// The value's length, in bytes.
    fn len(&self) -> u64;
    /// True for a value of 0 bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A value read by `get_buffer`: a block of a full client's local buffer, or of a dummy
/// client's memory shared with its standalone client. The bytes stay valid, and are the
/// owner's alone, until it is dropped.
pub struct HeldBuffer(Box<dyn Held>);

impl HeldBuffer {
    /// Wraps memory that holds a value (boxed: the two clients hold different kinds).
    pub fn new(held: impl Held + 'static) -> HeldBuffer {
        HeldBuffer(Box::new(held))
    }
    /// The value's first byte, a virtual address of this process (registered memory: it may
    /// be handed to the zero-copy calls).
    pub fn addr(&self) -> u64 {
        self.0.addr()
    }
    /// The value's length, in bytes.
    pub fn len(&self) -> u64 {
        self.0.len()
    }
    /// True for a value of 0 bytes.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
    /// The bytes (what the get wrote there).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `Held` memory belongs to this value alone while it lives, and the get that
        // filled it has ended.
        unsafe { std::slice::from_raw_parts(self.addr() as *const u8, self.len() as usize) }
    }
}

impl std::fmt::Debug for HeldBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldBuffer").field("addr", &self.addr()).field("len", &self.len()).finish()
    }
}

/// Memory that a get of bytes ([`StoreApi::get_with`](crate::StoreApi::get_with)) writes the value into, made by the
/// caller once the value's size is known: a binding's own object (a Python `bytes`), a buffer
/// of the caller's choosing. The get writes every byte of it or fails; the caller takes the
/// value out of its sink after a get that succeeded (after one that failed, its bytes are
/// unwritten and must not be read).
pub trait ValueSink: Send {
    /// Memory for a value of `size` bytes, exactly `size` bytes long (a shorter or longer one
    /// is refused as the caller's mistake). Called before any byte of the value is read; it
    /// may be called again in the same get (a disk file read while the master was asked that
    /// turned out not to be the value: then with the size the master gave), and the memory
    /// the last call returned is the one that holds the value. An error (the memory could not
    /// be had) ends the get with it.
    fn buffer(&mut self, size: u64) -> Result<&mut [MaybeUninit<u8>]>;
}

/// Where a buffer's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Memory {
    /// Memory of this process's host (what the store moves today).
    Host,
    /// Memory of GPU `cuda:N` (a device pointer).
    Cuda(u32),
}

/// `len` bytes at `addr`, in host or device memory: one entry of a scatter/gather list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    /// The first byte: a virtual address of this process (host) or a device pointer.
    pub addr: u64,
    /// The length, in bytes.
    pub len: u64,
    /// Where the bytes live.
    pub memory: Memory,
}

impl Buffer {
    /// `len` bytes of host memory at `addr`.
    pub fn host(addr: u64, len: u64) -> Buffer {
        Buffer { addr, len, memory: Memory::Host }
    }

    /// `len` bytes of the memory of GPU `cuda:device` at `addr`.
    pub fn cuda(device: u32, addr: u64, len: u64) -> Buffer {
        Buffer { addr, len, memory: Memory::Cuda(device) }
    }
}

/// Where a put's value comes from.
pub enum Source<'a> {
    /// Plain bytes, copied through the client's local buffer.
    Bytes(&'a [u8]),
    /// Plain bytes in parts, one after another (the value is their concatenation).
    Parts(Vec<&'a [u8]>),
    /// Registered memory, zero copy: the value is the buffers' bytes, in order.
    Buffers(Vec<Buffer>),
}

/// Where a get's value goes.
pub enum Dest<'a> {
    /// A new vector ([`Outcome::Bytes`]).
    Bytes,
    /// The memory the sink gives once the size is known ([`Outcome::Size`]).
    Sink(&'a mut dyn ValueSink),
    /// Registered memory, zero copy, filled in order ([`Outcome::Size`]).
    Buffers(Vec<Buffer>),
    /// A block of the client's memory held for the caller ([`Outcome::Held`]).
    Held,
}

/// One store operation.
pub enum Op<'a> {
    /// The whole value of `key`, into `into`.
    Get {
        /// The key.
        key: &'a str,
        /// Where the value goes.
        into: Dest<'a>,
    },
    /// Stores a value under `key`; a key that exists keeps its value unless `upsert`.
    Put {
        /// The key.
        key: &'a str,
        /// Where the value comes from.
        from: Source<'a>,
        /// Replace the key's value if it has one.
        upsert: bool,
    },
    /// Whether a committed object has `key` ([`Outcome::Exists`]).
    Exists {
        /// The key.
        key: &'a str,
    },
    /// The size of `key`'s value ([`Outcome::Size`]).
    Size {
        /// The key.
        key: &'a str,
    },
    /// Removes `key` (`force`: even while a reader holds its lease).
    Remove {
        /// The key.
        key: &'a str,
        /// Leased objects too.
        force: bool,
    },
    /// Removes every object whose key matches `pattern` ([`Outcome::Count`]).
    RemoveMatching {
        /// A regular expression.
        pattern: &'a str,
        /// Leased objects too.
        force: bool,
    },
    /// Removes every object ([`Outcome::Count`]).
    RemoveAll {
        /// Leased objects too.
        force: bool,
    },
}

/// What an op gave back.
#[derive(Debug)]
pub enum Outcome {
    /// A put or a remove that succeeded.
    Done,
    /// A get's value ([`Dest::Bytes`]).
    Bytes(Vec<u8>),
    /// A get's size (into a sink or buffers), or an object's size ([`Op::Size`]).
    Size(u64),
    /// [`Op::Exists`]'s answer.
    Exists(bool),
    /// A get's value held for the caller ([`Dest::Held`]).
    Held(HeldBuffer),
    /// How many objects a remove of many removed.
    Count(u64),
}

/// Ops run by one [`StoreApi::run`](crate::StoreApi::run), with the options of their puts.
pub struct Batch<'a> {
    /// The ops, in order; the outcomes come back in the same order.
    pub ops: Vec<Op<'a>>,
    /// The options of the puts.
    pub options: PutOptions,
    /// Consecutive ops of one kind run as one batched call (else one call each).
    pub together: bool,
}

impl<'a> Batch<'a> {
    /// One op.
    pub fn one(op: Op<'a>, options: PutOptions) -> Batch<'a> {
        Batch { ops: vec![op], options, together: false }
    }

    /// `ops`, consecutive ops of one kind in one batched call each.
    pub fn together(ops: Vec<Op<'a>>, options: PutOptions) -> Batch<'a> {
        Batch { ops, options, together: true }
    }
}

/// An op's kind, as far as batching goes: consecutive ops of one kind run as one call.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    GetBytes,
    GetSink,
    GetBuffers,
    GetHeld,
    PutBytes(bool),
    PutParts(bool),
    PutBuffers(bool),
    Exists,
    Size,
    Remove,
    RemoveMany,
}

impl Op<'_> {
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Op::Get { into: Dest::Bytes, .. } => Kind::GetBytes,
            Op::Get { into: Dest::Sink(_), .. } => Kind::GetSink,
            Op::Get { into: Dest::Buffers(_), .. } => Kind::GetBuffers,
            Op::Get { into: Dest::Held, .. } => Kind::GetHeld,
            Op::Put { from: Source::Bytes(_), upsert, .. } => Kind::PutBytes(*upsert),
            Op::Put { from: Source::Parts(_), upsert, .. } => Kind::PutParts(*upsert),
            Op::Put { from: Source::Buffers(_), upsert, .. } => Kind::PutBuffers(*upsert),
            Op::Exists { .. } => Kind::Exists,
            Op::Size { .. } => Kind::Size,
            Op::Remove { .. } => Kind::Remove,
            Op::RemoveMatching { .. } | Op::RemoveAll { .. } => Kind::RemoveMany,
        }
    }

    pub(crate) fn key(&self) -> &str {
        match self {
            Op::Get { key, .. }
            | Op::Put { key, .. }
            | Op::Exists { key }
            | Op::Size { key }
            | Op::Remove { key, .. } => key,
            Op::RemoveMatching { pattern, .. } => pattern,
            Op::RemoveAll { .. } => "",
        }
    }

    /// The op's buffers.
    pub(crate) fn buffers(&self) -> &[Buffer] {
        match self {
            Op::Get { into: Dest::Buffers(b), .. } | Op::Put { from: Source::Buffers(b), .. } => b,
            _ => &[],
        }
    }

    /// Refused before it runs: a buffer tagged as memory of a GPU that `device_of` (the
    /// client's registrations) does not place on that GPU.
    pub(crate) fn refusal(&self, device_of: impl Fn(u64, u64) -> Option<u32>) -> Option<StoreError> {
        self.buffers().iter().find_map(|b| match b.memory {
            Memory::Cuda(device) if b.len > 0 && device_of(b.addr, b.len) != Some(device) => {
                Some(StoreError::DeviceMemory { key: self.key().to_string(), device, addr: b.addr, len: b.len })
            }
            Memory::Host | Memory::Cuda(_) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::client::StoreApi;
    use crate::master::server;
    use crate::{ClientConfig, StoreClient};

    #[test]
    fn a_batch_runs_its_ops_in_order_and_refuses_device_buffers_alone() {
        let m = server::start_loopback();
        let client = StoreClient::connect(ClientConfig {
            master_server_address: m.client_address(),
            local_hostname: Some("127.0.0.1".into()),
            global_segment_size: 8 << 20,
            local_buffer_size: 1 << 20,
            ping_interval: Duration::from_millis(50),
            ..ClientConfig::default()
        })
        .expect("a client of the loopback master");
        let api: &dyn StoreApi = &*client;
        let options = api.default_options();
        let puts = vec![
            Op::Put { key: "a", from: Source::Bytes(b"alpha"), upsert: false },
            Op::Put { key: "b", from: Source::Parts(vec![b"be", b"ta"]), upsert: false },
            Op::Put { key: "g", from: Source::Buffers(vec![Buffer::cuda(0, 0x1000, 8)]), upsert: false },
        ];
        let got = api.run(Batch::together(puts, options.clone())).unwrap();
        assert!(matches!(got[0], Ok(Outcome::Done)) && matches!(got[1], Ok(Outcome::Done)));
        assert!(matches!(&got[2], Err(StoreError::DeviceMemory { key, device: 0, .. }) if key == "g"));

        let reads = vec![
            Op::Get { key: "a", into: Dest::Bytes },
            Op::Get { key: "b", into: Dest::Bytes },
            Op::Exists { key: "g" },
            Op::Size { key: "b" },
        ];
        let got = api.run(Batch::together(reads, options.clone())).unwrap();
        assert!(matches!(&got[0], Ok(Outcome::Bytes(v)) if v == b"alpha"));
        assert!(matches!(&got[1], Ok(Outcome::Bytes(v)) if v == b"beta"));
        assert!(matches!(got[2], Ok(Outcome::Exists(false))));
        assert!(matches!(got[3], Ok(Outcome::Size(4))));

        let got = api.run(Batch::one(Op::Remove { key: "a", force: true }, options.clone())).unwrap();
        assert!(matches!(got[0], Ok(Outcome::Done)));
        let got = api.run(Batch::one(Op::Get { key: "a", into: Dest::Bytes }, options)).unwrap();
        assert!(matches!(got[0], Err(StoreError::NotFound(_))));
    }
}
