//! Tenant scoping of the master's messages, in one place: which names of each request are a
//! tenant's (scoped on the way in, [`Inbound`]) and which of each reply are handed back to it
//! (unscoped on the way out, another tenant's dropped or blanked, [`Outbound`]). The handlers
//! never scope a name themselves; [`crate::master::tenant`] says how one name is scoped.

use crate::master::access::Tenant;
use crate::master::tenant;
use crate::proto::*;

/// A request whose keys and client ids become the master's names for the tenant's.
pub(super) trait Inbound {
    fn scope(&mut self, t: &Tenant);
}

/// A reply whose names go back to the tenant's client: its own names, none of another's.
pub(super) trait Outbound {
    fn unscope(&mut self, t: &Tenant);
}

/// A field of a request that names keys or clients.
trait Names {
    fn scope_names(&mut self, t: &Tenant);
}

impl Names for String {
    fn scope_names(&mut self, t: &Tenant) {
        tenant::scope_in_place(&t.0, self);
    }
}

impl<N: Names> Names for Vec<N> {
    fn scope_names(&mut self, t: &Tenant) {
        self.iter_mut().for_each(|n| n.scope_names(t));
    }
}

/// Entries named by their key: scoped on the way in; on the way out, another tenant's left out.
trait Keyed {
    fn key(&mut self) -> &mut String;
}

macro_rules! keyed {
    ($($entry:ty),* $(,)?) => {
        $(
            impl Keyed for $entry {
                fn key(&mut self) -> &mut String {
                    &mut self.key
                }
            }

            impl Names for $entry {
                fn scope_names(&mut self, t: &Tenant) {
                    self.key.scope_names(t);
                }
            }
        )*
    };
}

keyed!(DiskEntry, HeldRemoval, PublishedKey, OwnedObject, TaskAssignment, ReplicationTask);

/// `entries` of the tenant only, under its names.
fn own_entries<E: Keyed>(t: &Tenant, entries: &mut Vec<E>) {
    entries.retain_mut(|e| tenant::unscope_in_place(&t.0, e.key()));
}

/// `keys` of the tenant only, under its names.
fn own_keys(t: &Tenant, keys: &mut Vec<String>) {
    keys.retain_mut(|k| tenant::unscope_in_place(&t.0, k));
}

/// A client id going out to `t`'s client: its own name ("" for another tenant's, which the
/// master's rules never hand out).
pub(super) fn unscope_id(t: &Tenant, id: &mut String) {
    *id = tenant::unscope(&t.0, id).unwrap_or_default().to_string();
}

fn unscope_replicas(t: &Tenant, replicas: &mut [ReplicaDescriptor]) {
    replicas.iter_mut().for_each(|r| unscope_id(t, &mut r.client_id));
}

/// Requests by the fields that name keys or clients (none for a request that names neither).
macro_rules! inbound {
    ($($request:ty { $($field:ident),* }),* $(,)?) => {
        $(impl Inbound for $request {
            #[allow(unused_variables)]
            fn scope(&mut self, t: &Tenant) {
                $(self.$field.scope_names(t);)*
            }
        })*
    };
}

inbound!(
    MountSegmentRequest { client_id },
    UnmountSegmentRequest { client_id },
    PutStartRequest { client_id, key },
    GrantBlanksRequest { client_id },
    PutCommitBlankRequest { client_id, key },
    KeyRequest { client_id, key },
    BatchPutStartRequest { client_id, keys },
    BatchKeyRequest { client_id, keys },
    RemoveRequest { key },
    RemoveByRegexRequest {},
    RemoveAllRequest {},
    PingRequest { client_id },
    MountDiskRequest { client_id, held_removals },
    UpdateDiskReplicasRequest { client_id, added, removed },
    QueryKeysRequest { keys },
    NodeStatsRequest {},
    PublishRequest { client_id, keys },
    RetractRequest { client_id, keys },
    ReplicateStartRequest { client_id, key },
    ReplicateEndRequest { client_id, key },
    CreateCopyTaskRequest { key },
    CreateMoveTaskRequest { key },
    QueryTaskRequest {},
    FinishTaskRequest { client_id },
    BatchReplicaClearRequest { client_id, keys },
    TakeReplicationTasksRequest {},
    SubscribeRequest {},
    RemountWithReportRequest { client_id, objects },
    OwnerAck { client_id },
);

/// Replies that name nothing of a tenant's.
macro_rules! nameless {
    ($($reply:ty),* $(,)?) => {
        $(impl Outbound for $reply {
            fn unscope(&mut self, _t: &Tenant) {}
        })*
    };
}

nameless!(
    StatusReply,
    BatchStatusReply,
    ExistsReply,
    BatchExistsReply,
    RemoveByRegexReply,
    MountSegmentReply,
    UnmountSegmentReply,
    PublishReply,
    ReplicateEndReply,
    CreateTaskReply,
    RemountWithReportReply,
);

/// Replies by the fields that list replicas: their owners' ids under the tenant's names.
macro_rules! with_replicas {
    ($($reply:ty { $($field:ident),* }),* $(,)?) => {
        $(impl Outbound for $reply {
            fn unscope(&mut self, t: &Tenant) {
                $(unscope_replicas(t, &mut self.$field);)*
            }
        })*
    };
}

with_replicas!(
    PutStartReply { replicas },
    GetReplicaListReply { replicas },
    QueryKeyReply { replicas },
    ReplicateStartReply { sources, targets },
);

/// Batch replies: each item as its single form.
macro_rules! batch {
    ($($reply:ty),* $(,)?) => {
        $(impl Outbound for $reply {
            fn unscope(&mut self, t: &Tenant) {
                self.items.iter_mut().for_each(|i| i.unscope(t));
            }
        })*
    };
}

batch!(BatchPutStartReply, BatchGetReplicaListReply);

impl Outbound for GrantBlanksReply {
    fn unscope(&mut self, t: &Tenant) {
        self.blanks.iter_mut().filter_map(|b| b.replica.as_mut()).for_each(|r| unscope_id(t, &mut r.client_id));
    }
}

impl Outbound for PingReply {
    fn unscope(&mut self, t: &Tenant) {
        own_entries(t, &mut self.disk_removals);
        own_entries(t, &mut self.held_removals);
        own_entries(t, &mut self.disk_only);
        own_entries(t, &mut self.tasks);
    }
}

impl Outbound for QueryKeysReply {
    fn unscope(&mut self, t: &Tenant) {
        self.nodes.iter_mut().for_each(|n| unscope_id(t, &mut n.client_id));
    }
}

impl Outbound for PrefixQueryReply {
    fn unscope(&mut self, t: &Tenant) {
        self.nodes.iter_mut().for_each(|n| unscope_id(t, &mut n.client_id));
    }
}

impl Outbound for NodeStatsReply {
    /// The tenant's own clients only.
    fn unscope(&mut self, t: &Tenant) {
        self.nodes.retain_mut(|n| tenant::unscope_in_place(&t.0, &mut n.client_id));
    }
}

impl Outbound for QueryTaskReply {
    fn unscope(&mut self, t: &Tenant) {
        if let Some(task) = &mut self.task {
            unscope_id(t, &mut task.assigned_client);
        }
    }
}

impl Outbound for BatchReplicaClearReply {
    fn unscope(&mut self, t: &Tenant) {
        own_keys(t, &mut self.cleared_keys);
    }
}

impl Outbound for TakeReplicationTasksReply {
    fn unscope(&mut self, t: &Tenant) {
        own_entries(t, &mut self.tasks);
    }
}

impl Outbound for OwnerNews {
    /// The news are of the owner's segment, so of its tenant's keys.
    fn unscope(&mut self, t: &Tenant) {
        // A blank has no key: it is the owner's tenant's all the same.
        self.items.retain_mut(|i| i.blank || tenant::unscope_in_place(&t.0, &mut i.key));
    }
}
