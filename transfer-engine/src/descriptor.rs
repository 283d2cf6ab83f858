//! Segment descriptors: what a process exports (its registered buffers and how to reach its
//! transports). Descriptors from peers are untrusted and validated before use.

use crescent_transports::{Endpoint, RegionKeys};
use serde::{Deserialize, Deserializer, Serialize};

/// Longest segment name accepted.
pub const MAX_NAME_LEN: usize = 1024;
/// Most buffers one descriptor may list.
pub const MAX_BUFFERS: usize = 1 << 16;

/// One registered buffer of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferDescriptor {
    /// Its first byte's address in the owner's address space.
    pub addr: u64,
    /// Its length in bytes.
    pub length: u64,
    /// Where the memory is, as registered (`cpu:0`, ...).
    #[serde(default)]
    pub location: String,
    /// The transports' keys for it (rdma: one per device).
    #[serde(default)]
    pub keys: RegionKeys,
}

impl BufferDescriptor {
    /// The address one past its last byte (saturating).
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.length)
    }
}

/// What a segment's owner publishes: its name, host, transports and registered buffers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentDescriptor {
    /// The segment's name (its owner's `host:port`, as Mooncake names segments).
    pub name: String,
    /// Same host id = same kernel and same network namespace.
    #[serde(default)]
    pub host_id: String,
    /// Transports of the peer; entries of protocols this build does not know are skipped.
    #[serde(deserialize_with = "known_endpoints")]
    pub endpoints: Vec<Endpoint>,
    /// Its registered buffers (sorted by address once validated).
    pub buffers: Vec<BufferDescriptor>,
}

fn known_endpoints<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Endpoint>, D::Error> {
    let raw = Vec::<serde_json::Value>::deserialize(d)?;
    Ok(raw.into_iter().filter_map(|v| serde_json::from_value(v).ok()).collect())
}

impl SegmentDescriptor {
    /// Parses and validates a descriptor received from a peer or a metadata service.
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let d: SegmentDescriptor =
            serde_json::from_slice(bytes).map_err(|e| format!("not a segment descriptor: {e}"))?;
        d.validated()
    }

    /// The descriptor as JSON, as published and sent in the handshake.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a descriptor always serializes")
    }

    /// Checks the invariants the engine relies on; sorts buffers by address.
    pub fn validated(mut self) -> Result<Self, String> {
        if self.name.is_empty() || self.name.len() > MAX_NAME_LEN {
            return Err(format!("segment name of {} bytes (1..={MAX_NAME_LEN} allowed)", self.name.len()));
        }
        if self.buffers.len() > MAX_BUFFERS {
            return Err(format!("{} buffers listed ({MAX_BUFFERS} allowed)", self.buffers.len()));
        }
        self.buffers.sort_by_key(|b| b.addr);
        for b in &self.buffers {
            if b.length == 0 || b.addr.checked_add(b.length).is_none() {
                return Err(format!("buffer [{:#x}, +{}) is not a valid range", b.addr, b.length));
            }
        }
        for w in self.buffers.windows(2) {
            if w[0].end() > w[1].addr {
                return Err(format!("buffers at {:#x} and {:#x} overlap", w[0].addr, w[1].addr));
            }
        }
        Ok(self)
    }

    /// End of the buffer containing `addr`, if any.
    pub fn buffer_end(&self, addr: u64) -> Option<u64> {
        self.buffer_at(addr).map(BufferDescriptor::end)
    }

    /// The buffer holding `addr`, if one does.
    pub fn buffer_at(&self, addr: u64) -> Option<&BufferDescriptor> {
        let i = self.buffers.partition_point(|b| b.addr <= addr);
        let b = self.buffers.get(i.checked_sub(1)?)?;
        (addr < b.end()).then_some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> SegmentDescriptor {
        SegmentDescriptor {
            name: "10.0.0.1:1234".into(),
            host_id: "h".into(),
            endpoints: vec![Endpoint::Tcp { host: "10.0.0.1".into(), port: 5 }],
            buffers: vec![
                BufferDescriptor { addr: 0x3000, length: 0x1000, location: "cpu:0".into(), keys: Default::default() },
                BufferDescriptor { addr: 0x1000, length: 0x1000, location: "cpu:0".into(), keys: Default::default() },
            ],
        }
    }

    #[test]
    fn roundtrip_sorts_and_finds_buffers() {
        let d = SegmentDescriptor::from_json(&sample().to_json()).unwrap();
        assert_eq!(d.buffers[0].addr, 0x1000);
        assert_eq!(d.buffer_end(0x1000), Some(0x2000));
        assert_eq!(d.buffer_end(0x1fff), Some(0x2000));
        assert_eq!(d.buffer_end(0x2000), None);
        assert_eq!(d.buffer_end(0x3500), Some(0x4000));
        assert_eq!(d.buffer_end(0), None);
    }

    #[test]
    fn unknown_protocols_are_skipped() {
        let json = br#"{"name":"a:1","endpoints":[{"protocol":"warp","x":1},{"protocol":"tcp","host":"a","port":2}],"buffers":[]}"#;
        let d = SegmentDescriptor::from_json(json).unwrap();
        assert_eq!(d.endpoints, vec![Endpoint::Tcp { host: "a".into(), port: 2 }]);
    }

    #[test]
    fn invalid_descriptors_are_rejected() {
        let mut d = sample();
        d.buffers[0].addr = 0x1800;
        assert!(d.validated().unwrap_err().contains("overlap"));
        let mut d = sample();
        d.buffers[0].length = 0;
        assert!(d.validated().is_err());
        let mut d = sample();
        d.buffers[0].addr = u64::MAX;
        assert!(d.validated().is_err());
        let mut d = sample();
        d.name = String::new();
        assert!(d.validated().is_err());
        assert!(SegmentDescriptor::from_json(b"{\"name\": 5}").is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = SegmentDescriptor::from_json(&bytes);
        }
    }
}
