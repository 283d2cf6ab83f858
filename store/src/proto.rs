//! Generated gRPC types of the master service (`proto/master.proto`).
#![allow(clippy::all, missing_docs)]
tonic::include_proto!("crescent.master.v1");
