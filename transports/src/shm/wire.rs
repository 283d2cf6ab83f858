//! The shm transport's control messages: fixed 120-byte little-endian frames, one per
//! `SOCK_SEQPACKET` message, so a frame is never split or merged with another.
//!
//! ```text
//! 0      2         3      4        5      6          8      16      24      32       40
//! | "CS" | version | kind | status | mode | reserved | id   | addr  | len   | region |
//! 40       44         48       56            120
//! | device | reserved | offset | ipc handle |      (zero unless mode = DeviceIpc)
//! ```
//! * `Hello {id = features}` → `HelloReply {addr, len = 8, id = probe value}`: where the target
//!   keeps a probe word, so the initiator can test whether the kernel lets it use
//!   `process_vm_readv` on it. The hello's `id` holds the [`FEATURES`] the initiator takes
//!   (initiators before them send 0, which targets before them never read).
//! * `mode = DeviceVmm` (only to an initiator whose hello has [`FEATURE_DEVICE_VMM`]): device
//!   memory of the virtual memory management API, whose allocation comes as the file
//!   descriptor attached to the reply (`cuMemExportToShareableHandle`); the device block holds
//!   `device`, `offset` and, instead of an IPC handle, the allocation's size (8 bytes, the
//!   rest zero). A target whose initiator lacks the feature answers `DeviceUnavailable`.
//! * `Map {id, addr, len}` → `MapReply {id, status, mode, addr, len, region}`: the registered
//!   region holding `[addr, +len)` (its whole extent and its id), reached by mapping the memfd
//!   that comes with the reply (`mode = Memfd`), by `process_vm_*` (`mode = ProcessVm`), or,
//!   for device memory, by opening the allocation's IPC handle on the initiator's `device`
//!   (`mode = DeviceIpc`): the region starts `offset` bytes into the allocation. A target that
//!   cannot export its device memory answers `status = DeviceUnavailable`.
//! * target → initiator `Revoke {region}` → `RevokeAck {region}`: the region is being
//!   unregistered; the ack says that no copy of the initiator uses it any more.
//!
//! Frames come from another process and are untrusted: [`Frame::decode`] checks every field.

use crate::device::IPC_HANDLE_LEN;
use crate::net::{Format, FrameError};

/// The first two bytes of every frame.
pub const MAGIC: [u8; 2] = *b"CS";
/// The version this side speaks; a peer of another version is refused. Additions that keep
/// the layout (a new mode) are announced in the hello's [`FEATURES`] instead, so that peers
/// of version 2 without them keep working with those with them.
pub const VERSION: u8 = 2;
/// Feature bit: the initiator takes `DeviceVmm` grants (device memory as a descriptor).
pub const FEATURE_DEVICE_VMM: u64 = 1;
/// The features an initiator of this build announces in its hello.
pub const FEATURES: u64 = FEATURE_DEVICE_VMM;
/// Every frame's size, in bytes (one `SOCK_SEQPACKET` message).
pub const FRAME_LEN: usize = 120;
/// Where the device block starts (the frames of version 1 ended there).
const DEVICE_AT: usize = 40;
/// The frame layout in the net layer's terms: a fixed header and no payload.
pub const FORMAT: Format = Format {
    name: "shm control",
    magic: &MAGIC,
    version: VERSION,
    header_len: FRAME_LEN,
    length_at: None,
    max_payload: 0,
};
/// Size of the target's probe word.
pub const PROBE_LEN: u64 = 8;

/// A control message's kind (its wire code is the discriminant); the module doc says which
/// fields each one sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Initiator → target, first message: asks where the probe word is.
    Hello = 1,
    /// Target → initiator: `addr`/`len` of the probe word, `id` the value it holds.
    HelloReply = 2,
    /// Initiator → target: asks for the region holding `[addr, +len)`; `id` names the request.
    Map = 3,
    /// Target → initiator: the answer to the `Map` with the same `id`.
    MapReply = 4,
    /// Target → initiator: region `region` is being unregistered.
    Revoke = 5,
    /// Initiator → target: no copy uses region `region` any more.
    RevokeAck = 6,
}

/// The outcome a `MapReply` carries (every other kind carries `Ok`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// The range is granted.
    Ok = 0,
    /// The range is not inside one registered region of the target.
    OutOfRange = 1,
    /// The range is device memory the target cannot export (its driver refused).
    DeviceUnavailable = 2,
}

/// How the initiator reaches a granted region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// No access granted: every kind but a successful `MapReply`.
    None = 0,
    /// Map the memfd that comes with the reply; copies are plain memcpy.
    Memfd = 1,
    /// `process_vm_readv`/`process_vm_writev` on the target's address range.
    ProcessVm = 2,
    /// Device memory: open the IPC handle of [`Frame::ipc`] and copy with the device driver.
    DeviceIpc = 3,
    /// Device memory of the virtual memory management API: import the descriptor that comes
    /// with the reply ([`Frame::vmm`]) and copy with the device driver.
    DeviceVmm = 4,
}

/// How to open a granted region of device memory (a `DeviceIpc` grant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcGrant {
    /// The target's device ordinal for the allocation.
    pub device: u32,
    /// Where the region starts in the allocation, in bytes.
    pub offset: u64,
    /// The allocation's IPC handle.
    pub handle: [u8; IPC_HANDLE_LEN],
}

/// How to map a granted region of VMM device memory (a `DeviceVmm` grant), whose allocation
/// is the descriptor attached to the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmmGrant {
    /// The target's device ordinal for the allocation.
    pub device: u32,
    /// Where the region starts in the allocation, in bytes.
    pub offset: u64,
    /// The allocation's size, in bytes (what the initiator maps).
    pub size: u64,
}

/// One control message, decoded. Fields a kind does not use are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Which message it is.
    pub kind: Kind,
    /// A `MapReply`'s outcome; `Ok` otherwise.
    pub status: Status,
    /// How a granted region is reached; `None` unless a successful `MapReply`.
    pub mode: Mode,
    /// A `Map`'s request id (echoed by its `MapReply`), or a `HelloReply`'s probe value.
    pub id: u64,
    /// Start address, in the target's address space: of the requested range (`Map`), of
    /// the granted region (`MapReply`) or of the probe word (`HelloReply`).
    pub addr: u64,
    /// Length in bytes of the range `addr` starts.
    pub len: u64,
    /// The target's id of a granted, revoked or released region.
    pub region: u64,
    /// How to open a `DeviceIpc` grant; `None` for every other frame.
    pub ipc: Option<IpcGrant>,
    /// How to map a `DeviceVmm` grant; `None` for every other frame.
    pub vmm: Option<VmmGrant>,
}

/// Why a received control message was refused; the connection is then dropped.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The message is not [`FRAME_LEN`] bytes long.
    #[error("a control message of {0} bytes (frames are {FRAME_LEN})")]
    Length(usize),
    /// Bad magic or version: the net layer's checks.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The kind byte names no [`Kind`].
    #[error("unknown message kind {0}")]
    Kind(u8),
    /// The status byte names no [`Status`].
    #[error("unknown status {0}")]
    Status(u8),
    /// The mode byte names no [`Mode`].
    #[error("unknown access mode {0}")]
    Mode(u8),
    /// Bytes 6..8 are not zero, or the device block of a frame that has none, or its
    /// reserved bytes.
    #[error("reserved bytes are not zero")]
    Reserved,
    /// A frame that must carry a range carries an empty, null or wrapping one (or a probe
    /// word that is not [`PROBE_LEN`] bytes).
    #[error("a {kind:?} frame with an invalid range [{addr:#x}, +{len})")]
    Range {
        /// The frame's kind.
        kind: Kind,
        /// The range's start.
        addr: u64,
        /// The range's length, in bytes.
        len: u64,
    },
    /// Status and mode contradict each other or the kind (a granted `MapReply` without a
    /// mode, a refusal with one, a status on a kind that has none).
    #[error("a {0:?} frame with an inconsistent status or mode")]
    Inconsistent(Kind),
}

impl Frame {
    /// A frame of `kind` with every other field zero (`Ok`, `None`).
    pub fn new(kind: Kind) -> Frame {
        Frame { kind, status: Status::Ok, mode: Mode::None, id: 0, addr: 0, len: 0, region: 0, ipc: None, vmm: None }
    }

    /// The frame's wire bytes (layout in the module doc).
    pub fn encode(&self) -> [u8; FRAME_LEN] {
        let mut b = [0u8; FRAME_LEN];
        FORMAT.put_prefix(&mut b, self.kind as u8);
        b[4] = self.status as u8;
        b[5] = self.mode as u8;
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.region.to_le_bytes());
        if let Some(ipc) = &self.ipc {
            b[DEVICE_AT..DEVICE_AT + 4].copy_from_slice(&ipc.device.to_le_bytes());
            b[DEVICE_AT + 8..DEVICE_AT + 16].copy_from_slice(&ipc.offset.to_le_bytes());
            b[DEVICE_AT + 16..].copy_from_slice(&ipc.handle);
        }
        if let Some(vmm) = &self.vmm {
            b[DEVICE_AT..DEVICE_AT + 4].copy_from_slice(&vmm.device.to_le_bytes());
            b[DEVICE_AT + 8..DEVICE_AT + 16].copy_from_slice(&vmm.offset.to_le_bytes());
            b[DEVICE_AT + 16..DEVICE_AT + 24].copy_from_slice(&vmm.size.to_le_bytes());
        }
        b
    }

    /// Parses and validates a frame received from a peer (untrusted bytes).
    pub fn decode(b: &[u8]) -> Result<Frame, WireError> {
        let b: &[u8; FRAME_LEN] = b.try_into().map_err(|_| WireError::Length(b.len()))?;
        let kind = match FORMAT.check(b)? {
            1 => Kind::Hello,
            2 => Kind::HelloReply,
            3 => Kind::Map,
            4 => Kind::MapReply,
            5 => Kind::Revoke,
            6 => Kind::RevokeAck,
            k => return Err(WireError::Kind(k)),
        };
        let status = match b[4] {
            0 => Status::Ok,
            1 => Status::OutOfRange,
            2 => Status::DeviceUnavailable,
            s => return Err(WireError::Status(s)),
        };
        let mode = match b[5] {
            0 => Mode::None,
            1 => Mode::Memfd,
            2 => Mode::ProcessVm,
            3 => Mode::DeviceIpc,
            4 => Mode::DeviceVmm,
            m => return Err(WireError::Mode(m)),
        };
        if b[6] != 0 || b[7] != 0 {
            return Err(WireError::Reserved);
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let device = u32::from_le_bytes(b[DEVICE_AT..DEVICE_AT + 4].try_into().expect("4 bytes"));
        let (ipc, vmm) = match mode {
            Mode::DeviceIpc if b[DEVICE_AT + 4..DEVICE_AT + 8] == [0; 4] => {
                let handle = b[DEVICE_AT + 16..].try_into().expect("the handle's bytes");
                (Some(IpcGrant { device, offset: u64_at(DEVICE_AT + 8), handle }), None)
            }
            Mode::DeviceVmm
                if b[DEVICE_AT + 4..DEVICE_AT + 8] == [0; 4] && b[DEVICE_AT + 24..].iter().all(|&x| x == 0) =>
            {
                (None, Some(VmmGrant { device, offset: u64_at(DEVICE_AT + 8), size: u64_at(DEVICE_AT + 16) }))
            }
            Mode::DeviceIpc | Mode::DeviceVmm => return Err(WireError::Reserved),
            _ if b[DEVICE_AT..].iter().all(|&x| x == 0) => (None, None),
            _ => return Err(WireError::Reserved),
        };
        let frame = Frame {
            kind,
            status,
            mode,
            id: u64_at(8),
            addr: u64_at(16),
            len: u64_at(24),
            region: u64_at(32),
            ipc,
            vmm,
        };
        frame.validate()?;
        Ok(frame)
    }

    fn validate(&self) -> Result<(), WireError> {
        let range_ok = self.addr != 0 && self.len != 0 && self.addr.checked_add(self.len).is_some();
        let bad_range = || WireError::Range { kind: self.kind, addr: self.addr, len: self.len };
        let inconsistent = || WireError::Inconsistent(self.kind);
        match self.kind {
            Kind::MapReply => match (self.status, self.mode) {
                (Status::Ok, Mode::None) => return Err(inconsistent()),
                (Status::OutOfRange | Status::DeviceUnavailable, mode) if mode != Mode::None => {
                    return Err(inconsistent())
                }
                (Status::Ok, _) if !range_ok => return Err(bad_range()),
                (Status::Ok, Mode::DeviceIpc)
                    if self.ipc.is_none_or(|ipc| ipc.offset.checked_add(self.len).is_none()) =>
                {
                    return Err(bad_range())
                }
                // The region must lie inside the allocation the initiator maps.
                (Status::Ok, Mode::DeviceVmm)
                    if self.vmm.is_none_or(|vmm| vmm.offset.checked_add(self.len).is_none_or(|end| end > vmm.size)) =>
                {
                    return Err(bad_range())
                }
                _ => {}
            },
            _ if self.status != Status::Ok || self.mode != Mode::None => return Err(inconsistent()),
            Kind::Map if !range_ok => return Err(bad_range()),
            Kind::HelloReply if !range_ok || self.len != PROBE_LEN => return Err(bad_range()),
            _ => {}
        }
        Ok(())
    }

    /// Whether a file descriptor must come with this frame (and none may come with others).
    pub fn carries_fd(&self) -> bool {
        self.kind == Kind::MapReply && self.status == Status::Ok && matches!(self.mode, Mode::Memfd | Mode::DeviceVmm)
    }

    /// True when `[addr, +len)` of this (validated) frame contains `[addr, +len)`.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.addr + self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map_reply(mode: Mode) -> Frame {
        Frame { mode, id: 7, addr: 0x7000_0000, len: 1 << 20, region: 3, ..Frame::new(Kind::MapReply) }
    }

    fn device_reply() -> Frame {
        let ipc = IpcGrant { device: 1, offset: 4096, handle: std::array::from_fn(|i| i as u8 + 1) };
        Frame { ipc: Some(ipc), ..map_reply(Mode::DeviceIpc) }
    }

    fn vmm_reply() -> Frame {
        let vmm = VmmGrant { device: 1, offset: 4096, size: 4 << 20 };
        Frame { vmm: Some(vmm), ..map_reply(Mode::DeviceVmm) }
    }

    #[test]
    fn a_vmm_grant_roundtrips_carries_its_descriptor_and_lies_inside_its_allocation() {
        let f = vmm_reply();
        assert_eq!(Frame::decode(&f.encode()).unwrap(), f);
        assert!(f.carries_fd());
        // The region ends past the allocation the initiator maps.
        let past = Frame { vmm: Some(VmmGrant { offset: (3 << 20) + 1, ..f.vmm.unwrap() }), ..f };
        assert!(matches!(Frame::decode(&past.encode()), Err(WireError::Range { .. })));
        let wrapping = Frame { vmm: Some(VmmGrant { offset: u64::MAX - 4, ..f.vmm.unwrap() }), ..f };
        assert!(matches!(Frame::decode(&wrapping.encode()), Err(WireError::Range { .. })));
        // Bytes after the size are reserved, as are a VMM block's bytes 4..8.
        let mut b = f.encode();
        b[DEVICE_AT + 24] = 1;
        assert!(matches!(Frame::decode(&b), Err(WireError::Reserved)));
        let mut b = f.encode();
        b[DEVICE_AT + 5] = 1;
        assert!(matches!(Frame::decode(&b), Err(WireError::Reserved)));
        // A hello announcing features decodes (targets before them ignore its id).
        let hello = Frame { id: FEATURES, ..Frame::new(Kind::Hello) };
        assert_eq!(Frame::decode(&hello.encode()).unwrap(), hello);
    }

    #[test]
    fn frames_roundtrip() {
        let frames = [
            Frame::new(Kind::Hello),
            Frame { id: 0xdead_beef, addr: 0x1000, len: PROBE_LEN, ..Frame::new(Kind::HelloReply) },
            Frame { id: 1, addr: 0x1000, len: 5, ..Frame::new(Kind::Map) },
            map_reply(Mode::Memfd),
            map_reply(Mode::ProcessVm),
            device_reply(),
            Frame { status: Status::OutOfRange, id: 9, ..Frame::new(Kind::MapReply) },
            Frame { status: Status::DeviceUnavailable, id: 9, ..Frame::new(Kind::MapReply) },
            Frame { region: 4, ..Frame::new(Kind::Revoke) },
            Frame { region: 4, ..Frame::new(Kind::RevokeAck) },
        ];
        for f in frames {
            assert_eq!(Frame::decode(&f.encode()).unwrap(), f);
        }
        assert!(map_reply(Mode::Memfd).carries_fd());
        assert!(!map_reply(Mode::ProcessVm).carries_fd());
    }

    #[test]
    fn malformed_frames_are_rejected() {
        let good = map_reply(Mode::Memfd).encode();
        assert!(matches!(Frame::decode(&good[..39]), Err(WireError::Length(39))));
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(Frame::decode(&b), Err(WireError::Frame(FrameError::BadMagic { .. }))));
        let mut b = good;
        b[2] = 1;
        assert!(matches!(Frame::decode(&b), Err(WireError::Frame(FrameError::Version { found: 1, .. }))));
        let mut b = good;
        b[3] = 0;
        assert!(matches!(Frame::decode(&b), Err(WireError::Kind(0))));
        let mut b = good;
        b[5] = 9;
        assert!(matches!(Frame::decode(&b), Err(WireError::Mode(9))));
        let mut b = good;
        b[7] = 1;
        assert!(matches!(Frame::decode(&b), Err(WireError::Reserved)));
        // A granted region that wraps around the address space.
        let wrapping = Frame { addr: u64::MAX - 10, ..map_reply(Mode::ProcessVm) };
        assert!(matches!(Frame::decode(&wrapping.encode()), Err(WireError::Range { .. })));
        // A grant without a way to reach it, a refusal with one, a mode on a request.
        let no_mode = map_reply(Mode::None);
        assert!(Frame::decode(&no_mode.encode()).is_err());
        let refused_with_mode = Frame { status: Status::OutOfRange, ..map_reply(Mode::Memfd) };
        assert!(Frame::decode(&refused_with_mode.encode()).is_err());
        let map_with_mode = Frame { mode: Mode::Memfd, addr: 1, len: 1, ..Frame::new(Kind::Map) };
        assert!(Frame::decode(&map_with_mode.encode()).is_err());
        let empty_map = Frame::new(Kind::Map);
        assert!(Frame::decode(&empty_map.encode()).is_err());
        // A device grant without its handle, a device block on another frame, a refusal with
        // a device block.
        let mut b = device_reply().encode();
        b[DEVICE_AT + 4] = 1;
        assert!(matches!(Frame::decode(&b), Err(WireError::Reserved)));
        let mut b = map_reply(Mode::Memfd).encode();
        b[FRAME_LEN - 1] = 1;
        assert!(matches!(Frame::decode(&b), Err(WireError::Reserved)));
        let refused = Frame { status: Status::DeviceUnavailable, ..device_reply() };
        assert!(Frame::decode(&refused.encode()).is_err());
        let overflowing =
            Frame { ipc: Some(IpcGrant { offset: u64::MAX - 4, ..device_reply().ipc.unwrap() }), ..device_reply() };
        assert!(matches!(Frame::decode(&overflowing.encode()), Err(WireError::Range { .. })));
    }

    #[test]
    fn containment() {
        let f = map_reply(Mode::Memfd);
        assert!(f.contains(0x7000_0000, 1 << 20));
        assert!(f.contains(0x7000_0001, 5));
        assert!(!f.contains(0x7000_0000, (1 << 20) + 1));
        assert!(!f.contains(0x6fff_ffff, 2));
        assert!(!f.contains(u64::MAX, 2));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = Frame::decode(&bytes);
        }

        #[test]
        fn decoded_frames_are_consistent(mut bytes in proptest::array::uniform32(any::<u8>()),
                                         tail in proptest::array::uniform8(any::<u8>()),
                                         device in proptest::array::uniform16(any::<u8>()),
                                         kind in 1u8..=6, status in 0u8..=2, mode in 0u8..=4) {
            // Valid headers with arbitrary contents: whatever decodes keeps the invariants.
            bytes[0..2].copy_from_slice(&MAGIC);
            bytes[2] = VERSION;
            bytes[3] = kind;
            bytes[4] = status;
            bytes[5] = mode;
            bytes[6] = 0;
            bytes[7] = 0;
            let mut b = [0u8; FRAME_LEN];
            b[..32].copy_from_slice(&bytes);
            b[32..DEVICE_AT].copy_from_slice(&tail);
            b[DEVICE_AT..DEVICE_AT + 16].copy_from_slice(&device);
            if let Ok(f) = Frame::decode(&b) {
                prop_assert_eq!(f.ipc.is_some(), f.mode == Mode::DeviceIpc);
                prop_assert_eq!(f.vmm.is_some(), f.mode == Mode::DeviceVmm);
                if let (Some(vmm), Status::Ok) = (f.vmm, f.status) {
                    prop_assert!(vmm.offset.checked_add(f.len).is_some_and(|end| end <= vmm.size));
                }
                if f.kind == Kind::MapReply && f.status == Status::Ok {
                    prop_assert!(f.mode != Mode::None);
                    prop_assert!(f.addr.checked_add(f.len).is_some() && f.len > 0);
                }
                if f.kind == Kind::Map {
                    prop_assert!(f.addr.checked_add(f.len).is_some() && f.len > 0);
                }
                prop_assert_eq!(Frame::decode(&f.encode()).unwrap(), f);
            }
        }
    }
}
