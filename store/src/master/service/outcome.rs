//! What a reply says of its request, in one place: the status it carries for a result
//! ([`answer`], [`status`]) and how many of its items failed ([`Outcome`]), which the request
//! counters under Mooncake's names count ([`crate::master::mooncake_metrics`]).

use crate::error::StoreError;
use crate::master::Master;
use crate::proto::*;

/// How many of a reply's `asked` items failed (a status other than OK).
pub(super) trait Outcome {
    fn failed(&self, asked: usize) -> usize;
}

/// A reply with one status for its whole request.
pub(super) trait Single: Default {
    fn status_mut(&mut self) -> &mut Option<Status>;
}

fn is_failure(s: &Option<Status>) -> bool {
    s.as_ref().is_some_and(|s| s.code != Code::Ok as i32)
}

macro_rules! single {
    ($($reply:ty),* $(,)?) => {
        $(
            impl Single for $reply {
                fn status_mut(&mut self) -> &mut Option<Status> {
                    &mut self.status
                }
            }

            impl Outcome for $reply {
                fn failed(&self, _asked: usize) -> usize {
                    is_failure(&self.status) as usize
                }
            }
        )*
    };
}

single!(
    StatusReply,
    PutStartReply,
    GetReplicaListReply,
    ExistsReply,
    QueryKeyReply,
    RemoveByRegexReply,
    PingReply,
    MountSegmentReply,
    UnmountSegmentReply,
    ReplicateStartReply,
    ReplicateEndReply,
    TakeReplicationTasksReply,
    CreateTaskReply,
    QueryTaskReply,
    BatchReplicaClearReply,
    QueryKeysReply,
    PrefixQueryReply,
    NodeStatsReply,
    PublishReply,
    RemountWithReportReply,
    GrantBlanksReply,
);

impl Outcome for BatchPutStartReply {
    fn failed(&self, _asked: usize) -> usize {
        self.items.iter().filter(|i| is_failure(&i.status)).count()
    }
}

impl Outcome for BatchGetReplicaListReply {
    fn failed(&self, _asked: usize) -> usize {
        self.items.iter().filter(|i| is_failure(&i.status)).count()
    }
}

impl Outcome for BatchStatusReply {
    fn failed(&self, _asked: usize) -> usize {
        self.statuses.iter().filter(|s| s.code != Code::Ok as i32).count()
    }
}

impl Outcome for BatchExistsReply {
    fn failed(&self, asked: usize) -> usize {
        if is_failure(&self.status) {
            asked
        } else {
            0
        }
    }
}

pub(super) fn ok() -> Option<Status> {
    Some(Status { code: Code::Ok as i32, message: String::new() })
}

/// The status a reply carries for `e`; counted in the master's errors by kind.
pub(super) fn status(m: &Master, e: &StoreError) -> Option<Status> {
    m.metrics().error(e);
    Some(Status { code: e.code() as i32, message: e.to_string() })
}

/// The status of a result that holds nothing else.
pub(super) fn status_of(m: &Master, r: &Result<(), StoreError>) -> Status {
    match r {
        Ok(()) => ok(),
        Err(e) => status(m, e),
    }
    .expect("a status")
}

/// The reply for `r`: its value with an OK status, or an empty reply with the error's status.
pub(super) fn answer<R: Single>(m: &Master, r: Result<R, StoreError>) -> R {
    let (mut reply, s) = match r {
        Ok(reply) => (reply, ok()),
        Err(e) => (R::default(), status(m, &e)),
    };
    *reply.status_mut() = s;
    reply
}

/// The reply with only a status, for `r`.
pub(super) fn status_reply(m: &Master, r: Result<(), StoreError>) -> StatusReply {
    StatusReply { status: Some(status_of(m, &r)) }
}
