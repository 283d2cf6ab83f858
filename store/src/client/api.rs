//! The store's API as one trait, [`StoreApi`], implemented by the full client ([`StoreClient`],
//! which owns a segment, an engine and the disk tier) and by a dummy client
//! ([`super::dummy::DummyClient`], which forwards every call to a standalone client on this
//! host). Bindings (the Python `MooncakeDistributedStore`, the `crescent` tool) hold an
//! `Arc<dyn StoreApi>` and work with either.
//!
//! The methods mean what [`StoreClient`]'s methods of the same names mean; the provided ones
//! are the short forms (default options, one buffer).

use std::mem::MaybeUninit;

use crate::error::{Result, StoreError};
use crate::proto::{PutOptions, QueryKeyReply};

use super::sg::{Extent, Piece};
use super::{HeldBlock, StoreClient};

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

impl Held for HeldBlock {
    fn addr(&self) -> u64 {
        HeldBlock::addr(self)
    }
    fn len(&self) -> u64 {
        HeldBlock::len(self)
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

impl From<HeldBlock> for HeldBuffer {
    fn from(block: HeldBlock) -> HeldBuffer {
        HeldBuffer::new(block)
    }
}

impl std::fmt::Debug for HeldBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldBuffer").field("addr", &self.addr()).field("len", &self.len()).finish()
    }
}

/// Memory that a get of bytes ([`StoreClient::get_with`]) writes the value into, made by the
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

/// `sink`'s memory for a value of `size` bytes, refused unless it is exactly that long.
pub(crate) fn sink_buffer<'s>(
    key: &str,
    sink: &'s mut (dyn ValueSink + '_),
    size: u64,
) -> Result<&'s mut [MaybeUninit<u8>]> {
    let out = sink.buffer(size)?;
    let have = out.len() as u64;
    if have < size {
        return Err(StoreError::BufferTooSmall { key: key.to_string(), need: size, have });
    }
    if have > size {
        return Err(StoreError::invalid(format!(
            "get of {key:?}: the sink gave {have} bytes for a value of {size}; it must give exactly the size asked for"
        )));
    }
    Ok(out)
}

/// The store's calls, whichever client carries them out.
pub trait StoreApi: Send + Sync {
    /// The name of the segment this client's puts prefer (`local_first`): a full client's
    /// own, a dummy client's standalone client's.
    fn segment_name(&self) -> String;
    /// The options the calls without options use.
    fn default_options(&self) -> PutOptions;

    /// Whether the master answered lately (a dummy client asks its standalone client; false
    /// when that cannot be reached).
    fn master_reachable(&self) -> bool;

    /// Registers memory of this process for the zero-copy calls.
    fn register_buffer(&self, addr: u64, len: u64) -> Result<()>;
    /// Unregisters the buffer registered at `addr`, waiting a bounded time for transfers that
    /// still use it (an error if they do not end).
    fn unregister_buffer(&self, addr: u64) -> Result<()>;
    /// Whether `[addr, +len)` may be handed to the zero-copy calls as it is.
    fn is_registered(&self, addr: u64, len: u64) -> bool;

    /// Puts `value` under `key` with `options`; a key that exists is left as it was
    /// ([`StoreClient::put_with`]).
    fn put_with(&self, key: &str, value: &[u8], options: &PutOptions) -> Result<()>;
    /// Zero-copy put of the value made of `pieces` of registered memory, in order
    /// ([`StoreClient::put_from_sg`]).
    fn put_from_sg(&self, key: &str, pieces: &[Piece], options: &PutOptions) -> Result<()>;
    /// The whole value of `key`, copied into a new vector ([`StoreClient::get`]).
    fn get(&self, key: &str) -> Result<Vec<u8>>;
    /// The whole value of `key`, written into the memory `sink` gives once the size is known;
    /// returns the size ([`StoreClient::get_with`]). Provided: a [`StoreApi::get`] copied
    /// into the sink (a dummy client receives the value over its socket first).
    fn get_with(&self, key: &str, sink: &mut dyn ValueSink) -> Result<u64> {
        let value = self.get(key)?;
        sink_buffer(key, sink, value.len() as u64)?.write_copy_of_slice(&value);
        Ok(value.len() as u64)
    }
    /// Zero-copy get of the whole value into `pieces` of registered memory, in order; returns
    /// the object's size ([`StoreClient::get_into_sg`]).
    fn get_into_sg(&self, key: &str, pieces: &[Piece]) -> Result<u64>;
    /// Zero-copy get of ranges of the value; returns the bytes read
    /// ([`StoreClient::get_into_ranges`]).
    fn get_into_ranges(&self, key: &str, ranges: &[Extent]) -> Result<u64>;
    /// Puts that replace the key's value if it has one (Mooncake's upserts).
    fn upsert_with(&self, key: &str, value: &[u8], options: &PutOptions) -> Result<()>;
    /// [`StoreApi::put_from_sg`] that replaces the key's value if it has one.
    fn upsert_from_sg(&self, key: &str, pieces: &[Piece], options: &PutOptions) -> Result<()>;
    /// The value made of `parts`, one after another (`put_parts` / `upsert_parts`).
    fn put_parts_with(&self, key: &str, parts: &[&[u8]], options: &PutOptions) -> Result<()>;
    /// [`StoreApi::put_parts_with`] that replaces the key's value if it has one.
    fn upsert_parts_with(&self, key: &str, parts: &[&[u8]], options: &PutOptions) -> Result<()>;
    /// The value held in memory of this process until the result is dropped.
    fn get_buffer(&self, key: &str) -> Result<HeldBuffer>;

    /// Puts several values (bytes), `values[i]` under `keys[i]`; one result per key
    /// ([`StoreClient::put_batch_with`]).
    fn put_batch_with(&self, keys: &[String], values: &[&[u8]], options: &PutOptions) -> Result<Vec<Result<()>>>;
    /// Zero-copy puts of values each made of pieces of registered memory; one result per key
    /// ([`StoreClient::batch_put_from_sg`]).
    fn batch_put_from_sg(&self, keys: &[String], values: &[&[Piece]], options: &PutOptions) -> Result<Vec<Result<()>>>;
    /// The values of several keys, as bytes; one result per key ([`StoreClient::get_batch`]).
    fn get_batch(&self, keys: &[String]) -> Result<Vec<Result<Vec<u8>>>>;
    /// The values of several keys, each written into the memory its sink makes once the
    /// sizes are known; the size per key ([`StoreClient::get_batch_with`]). Provided: a
    /// [`StoreApi::get_batch`] copied into the sinks.
    fn get_batch_with(&self, keys: &[String], sinks: &mut [&mut dyn ValueSink]) -> Result<Vec<Result<u64>>> {
        if keys.len() != sinks.len() {
            return Err(StoreError::invalid(format!("{} keys but {} sinks", keys.len(), sinks.len())));
        }
        let values = self.get_batch(keys)?;
        Ok(values
            .into_iter()
            .zip(sinks.iter_mut())
            .zip(keys)
            .map(|((value, sink), key)| {
                let value = value?;
                sink_buffer(key, &mut **sink, value.len() as u64)?.write_copy_of_slice(&value);
                Ok(value.len() as u64)
            })
            .collect())
    }
    /// Zero-copy gets of several whole values, each into its pieces of registered memory;
    /// the size read per key ([`StoreClient::batch_get_into_sg`]).
    fn batch_get_into_sg(&self, keys: &[String], values: &[&[Piece]]) -> Result<Vec<Result<u64>>>;
    /// Zero-copy gets of ranges of several values; the bytes read per key
    /// ([`StoreClient::batch_get_into_ranges`]).
    fn batch_get_into_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>>;
    /// [`StoreApi::put_batch_with`] that replaces each key's value if it has one.
    fn upsert_batch_with(&self, keys: &[String], values: &[&[u8]], options: &PutOptions) -> Result<Vec<Result<()>>>;
    /// [`StoreApi::batch_put_from_sg`] that replaces each key's value if it has one.
    fn batch_upsert_from_sg(
        &self,
        keys: &[String],
        values: &[&[Piece]],
        options: &PutOptions,
    ) -> Result<Vec<Result<()>>>;
    /// [`StoreApi::get_buffer`] for several keys; one result per key.
    fn batch_get_buffer(&self, keys: &[String]) -> Result<Vec<Result<HeldBuffer>>>;

    /// Whether a committed object has this key (no lease is granted).
    fn exists(&self, key: &str) -> Result<bool>;
    /// [`StoreApi::exists`] for several keys, in one call to the master; one answer per key.
    fn batch_exists(&self, keys: &[String]) -> Result<Vec<bool>>;
    /// Everything the master knows of a key (replicas, size, lease), without side effects.
    fn query(&self, key: &str) -> Result<QueryKeyReply>;
    /// The size in bytes of a committed object (no lease is granted).
    fn get_size(&self, key: &str) -> Result<u64>;
    /// Removes an object; refused with [`crate::StoreError::Leased`] while a reader holds its
    /// lease, unless `force`.
    fn remove_with(&self, key: &str, force: bool) -> Result<()>;
    /// `force`: leased objects too.
    fn remove_by_regex_with(&self, pattern: &str, force: bool) -> Result<u64>;
    /// Removes every committed object (`force`: leased ones too); returns how many.
    fn remove_all_with(&self, force: bool) -> Result<u64>;

    /// Ends the client (a full client unmounts its segment; a dummy client releases what it
    /// shared with its standalone client). Twice is fine.
    fn close(&self) -> Result<()>;

    /// `len` bytes of memory shared with the standalone client (a dummy client's pool), usable
    /// by the zero-copy calls without registering. A full client has no pool: it allocates
    /// nothing here (register the caller's memory instead).
    fn alloc_from_mem_pool(&self, len: u64) -> Result<u64> {
        Err(crate::StoreError::invalid(format!(
            "alloc_from_mem_pool({len}): only a dummy client (setup_dummy) has a memory pool; register memory with \
             register_buffer instead"
        )))
    }

    // ---- sessions (Mooncake's `batch_*_session_*`): a full client keeps them ----

    /// See [`StoreClient::batch_get_session_start`].
    fn batch_get_session_start(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        let _ = keys;
        Err(no_sessions())
    }
    /// See [`StoreClient::batch_get_into_session_ranges`].
    fn batch_get_into_session_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>> {
        let _ = (keys, ranges);
        Err(no_sessions())
    }
    /// See [`StoreClient::batch_get_session_end`].
    fn batch_get_session_end(&self, keys: &[String]) -> Result<()> {
        let _ = keys;
        Err(no_sessions())
    }
    /// See [`StoreClient::batch_put_session_start`].
    fn batch_put_session_start(&self, keys: &[String], sizes: &[u64], options: &PutOptions) -> Result<Vec<Result<()>>> {
        let _ = (keys, sizes, options);
        Err(no_sessions())
    }
    /// See [`StoreClient::batch_put_from_session_ranges`].
    fn batch_put_from_session_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>> {
        let _ = (keys, ranges);
        Err(no_sessions())
    }
    /// See [`StoreClient::batch_put_session_end`].
    fn batch_put_session_end(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        let _ = keys;
        Err(no_sessions())
    }
    /// See [`StoreClient::batch_put_session_revoke`].
    fn batch_put_session_revoke(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        let _ = keys;
        Err(no_sessions())
    }

    // ---- short forms ----

    /// [`StoreApi::put_with`] with the default options.
    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.put_with(key, value, &self.default_options())
    }
    /// Zero-copy put of the `len` bytes of registered memory at `addr`.
    fn put_from_with(&self, key: &str, addr: u64, len: u64, options: &PutOptions) -> Result<()> {
        self.put_from_sg(key, &[Piece::new(addr, len)], options)
    }
    /// [`StoreApi::put_from_with`] with the default options.
    fn put_from(&self, key: &str, addr: u64, len: u64) -> Result<()> {
        self.put_from_with(key, addr, len, &self.default_options())
    }
    /// [`StoreApi::put_from_with`] that replaces the key's value if it has one.
    fn upsert_from_with(&self, key: &str, addr: u64, len: u64, options: &PutOptions) -> Result<()> {
        self.upsert_from_sg(key, &[Piece::new(addr, len)], options)
    }
    /// Zero-copy get of the whole value into the `len` bytes of registered memory at `addr`;
    /// returns the object's size ([`crate::StoreError::BufferTooSmall`] if `len` is less).
    fn get_into(&self, key: &str, addr: u64, len: u64) -> Result<u64> {
        self.get_into_sg(key, &[Piece::new(addr, len)])
    }
    /// [`StoreApi::put_batch_with`] with the default options.
    fn put_batch(&self, keys: &[String], values: &[&[u8]]) -> Result<Vec<Result<()>>> {
        self.put_batch_with(keys, values, &self.default_options())
    }
    /// Zero-copy puts of `sizes[i]` bytes at `addrs[i]` under `keys[i]`; the three lists must
    /// have one length ([`crate::StoreError::InvalidArgument`] otherwise).
    fn batch_put_from_with(
        &self,
        keys: &[String],
        addrs: &[u64],
        sizes: &[u64],
        options: &PutOptions,
    ) -> Result<Vec<Result<()>>> {
        let pieces = one_piece_each(keys, addrs, sizes)?;
        let values: Vec<&[Piece]> = pieces.iter().map(|p| &p[..]).collect();
        self.batch_put_from_sg(keys, &values, options)
    }
    /// [`StoreApi::batch_put_from_with`] with the default options.
    fn batch_put_from(&self, keys: &[String], addrs: &[u64], sizes: &[u64]) -> Result<Vec<Result<()>>> {
        self.batch_put_from_with(keys, addrs, sizes, &self.default_options())
    }
    /// Zero-copy gets of `keys[i]` into the `lens[i]` bytes at `addrs[i]`; the size read per
    /// key. The three lists must have one length.
    fn batch_get_into(&self, keys: &[String], addrs: &[u64], lens: &[u64]) -> Result<Vec<Result<u64>>> {
        let pieces = one_piece_each(keys, addrs, lens)?;
        let values: Vec<&[Piece]> = pieces.iter().map(|p| &p[..]).collect();
        self.batch_get_into_sg(keys, &values)
    }
    /// [`StoreApi::remove_with`] without `force`.
    fn remove(&self, key: &str) -> Result<()> {
        self.remove_with(key, false)
    }
    /// [`StoreApi::remove_by_regex_with`] without `force`.
    fn remove_by_regex(&self, pattern: &str) -> Result<u64> {
        self.remove_by_regex_with(pattern, false)
    }
    /// [`StoreApi::remove_all_with`] without `force`.
    fn remove_all(&self) -> Result<u64> {
        self.remove_all_with(false)
    }
}

/// A client that keeps no sessions (a dummy client: its standalone client would have to keep
/// them for it).
fn no_sessions() -> crate::StoreError {
    crate::StoreError::invalid(
        "get and put sessions need a client set up with setup(); a dummy client (setup_dummy) does not keep them",
    )
}

/// One piece per key, from parallel lists of addresses and lengths.
fn one_piece_each(keys: &[String], addrs: &[u64], lens: &[u64]) -> Result<Vec<[Piece; 1]>> {
    if keys.len() != addrs.len() || keys.len() != lens.len() {
        return Err(crate::StoreError::invalid("keys, buffers and sizes differ in length"));
    }
    Ok(addrs.iter().zip(lens).map(|(&a, &n)| [Piece::new(a, n)]).collect())
}

impl StoreApi for StoreClient {
    fn segment_name(&self) -> String {
        StoreClient::segment_name(self).to_string()
    }
    fn default_options(&self) -> PutOptions {
        StoreClient::default_options(self)
    }
    fn register_buffer(&self, addr: u64, len: u64) -> Result<()> {
        StoreClient::register_buffer(self, addr, len)
    }
    fn unregister_buffer(&self, addr: u64) -> Result<()> {
        StoreClient::unregister_buffer(self, addr)
    }
    fn put_with(&self, key: &str, value: &[u8], options: &PutOptions) -> Result<()> {
        StoreClient::put_with(self, key, value, options)
    }
    fn put_from_sg(&self, key: &str, pieces: &[Piece], options: &PutOptions) -> Result<()> {
        StoreClient::put_from_sg(self, key, pieces, options)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        StoreClient::get(self, key)
    }
    fn get_with(&self, key: &str, sink: &mut dyn ValueSink) -> Result<u64> {
        StoreClient::get_with(self, key, sink)
    }
    fn get_into_sg(&self, key: &str, pieces: &[Piece]) -> Result<u64> {
        StoreClient::get_into_sg(self, key, pieces)
    }
    fn get_into_ranges(&self, key: &str, ranges: &[Extent]) -> Result<u64> {
        StoreClient::get_into_ranges(self, key, ranges)
    }
    fn put_batch_with(&self, keys: &[String], values: &[&[u8]], options: &PutOptions) -> Result<Vec<Result<()>>> {
        StoreClient::put_batch_with(self, keys, values, options)
    }
    fn batch_put_from_sg(&self, keys: &[String], values: &[&[Piece]], options: &PutOptions) -> Result<Vec<Result<()>>> {
        StoreClient::batch_put_from_sg(self, keys, values, options)
    }
    fn get_batch(&self, keys: &[String]) -> Result<Vec<Result<Vec<u8>>>> {
        StoreClient::get_batch(self, keys)
    }
    fn get_batch_with(&self, keys: &[String], sinks: &mut [&mut dyn ValueSink]) -> Result<Vec<Result<u64>>> {
        StoreClient::get_batch_with(self, keys, sinks)
    }
    fn batch_get_into_sg(&self, keys: &[String], values: &[&[Piece]]) -> Result<Vec<Result<u64>>> {
        StoreClient::batch_get_into_sg(self, keys, values)
    }
    fn batch_get_into_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>> {
        StoreClient::batch_get_into_ranges(self, keys, ranges)
    }
    fn exists(&self, key: &str) -> Result<bool> {
        StoreClient::exists(self, key)
    }
    fn batch_exists(&self, keys: &[String]) -> Result<Vec<bool>> {
        StoreClient::batch_exists(self, keys)
    }
    fn query(&self, key: &str) -> Result<QueryKeyReply> {
        StoreClient::query(self, key)
    }
    fn get_size(&self, key: &str) -> Result<u64> {
        StoreClient::get_size(self, key)
    }
    fn remove_with(&self, key: &str, force: bool) -> Result<()> {
        StoreClient::remove_with(self, key, force)
    }
    fn remove_by_regex_with(&self, pattern: &str, force: bool) -> Result<u64> {
        StoreClient::remove_by_regex_with(self, pattern, force)
    }
    fn remove_all_with(&self, force: bool) -> Result<u64> {
        StoreClient::remove_all_with(self, force)
    }
    fn master_reachable(&self) -> bool {
        StoreClient::master_reachable(self)
    }
    fn is_registered(&self, addr: u64, len: u64) -> bool {
        self.engine().is_registered(addr, len)
    }
    fn upsert_with(&self, key: &str, value: &[u8], options: &PutOptions) -> Result<()> {
        StoreClient::upsert_with(self, key, value, options)
    }
    fn upsert_from_sg(&self, key: &str, pieces: &[Piece], options: &PutOptions) -> Result<()> {
        StoreClient::upsert_from_sg(self, key, pieces, options)
    }
    fn put_parts_with(&self, key: &str, parts: &[&[u8]], options: &PutOptions) -> Result<()> {
        StoreClient::put_parts_with(self, key, parts, options)
    }
    fn upsert_parts_with(&self, key: &str, parts: &[&[u8]], options: &PutOptions) -> Result<()> {
        StoreClient::upsert_parts_with(self, key, parts, options)
    }
    fn get_buffer(&self, key: &str) -> Result<HeldBuffer> {
        StoreClient::get_buffer(self, key).map(HeldBuffer::from)
    }
    fn upsert_batch_with(&self, keys: &[String], values: &[&[u8]], options: &PutOptions) -> Result<Vec<Result<()>>> {
        StoreClient::upsert_batch_with(self, keys, values, options)
    }
    fn batch_upsert_from_sg(
        &self,
        keys: &[String],
        values: &[&[Piece]],
        options: &PutOptions,
    ) -> Result<Vec<Result<()>>> {
        StoreClient::batch_upsert_from_sg(self, keys, values, options)
    }
    fn batch_get_buffer(&self, keys: &[String]) -> Result<Vec<Result<HeldBuffer>>> {
        Ok(StoreClient::batch_get_buffer(self, keys)?.into_iter().map(|r| r.map(HeldBuffer::from)).collect())
    }
    fn batch_get_session_start(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        StoreClient::batch_get_session_start(self, keys)
    }
    fn batch_get_into_session_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>> {
        StoreClient::batch_get_into_session_ranges(self, keys, ranges)
    }
    fn batch_get_session_end(&self, keys: &[String]) -> Result<()> {
        StoreClient::batch_get_session_end(self, keys);
        Ok(())
    }
    fn batch_put_session_start(&self, keys: &[String], sizes: &[u64], options: &PutOptions) -> Result<Vec<Result<()>>> {
        StoreClient::batch_put_session_start(self, keys, sizes, options)
    }
    fn batch_put_from_session_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>> {
        StoreClient::batch_put_from_session_ranges(self, keys, ranges)
    }
    fn batch_put_session_end(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        StoreClient::batch_put_session_end(self, keys)
    }
    fn batch_put_session_revoke(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        StoreClient::batch_put_session_revoke(self, keys)
    }
    fn close(&self) -> Result<()> {
        StoreClient::close(self)
    }
}
