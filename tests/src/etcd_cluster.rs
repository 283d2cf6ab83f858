//! The private etcd cluster of the HA tests (shared with the failover benchmark).

pub use crescent_benches::etcd_cluster::EtcdCluster;
