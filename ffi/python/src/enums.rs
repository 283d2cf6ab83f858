//! Mooncake's int enums as Python sees them (`SoftPinAction`, `ObjectDataType`,
//! `ReplicaStatus`, `TaskType`, `TaskStatus`): each a name and its values, declared by
//! [`mooncake_enums!`].

use pyo3::prelude::*;

/// Each enum: its docstring, Python name, Rust name and Mooncake's values; a frozen, hashable
/// `#[pyclass]` int enum.
macro_rules! mooncake_enums {
    ($(
        $(#[$attr:meta])*
        $name:literal as $ty:ident { $($variant:ident = $value:literal),+ $(,)? }
    )+) => {$(
        $(#[$attr])*
        #[pyclass(module = "crescent._crescent", name = $name, eq, eq_int, frozen, hash, from_py_object)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(clippy::upper_case_acronyms, non_camel_case_types)]
        pub(crate) enum $ty {
            $($variant = $value),+
        }
    )+};
}

mooncake_enums! {
    /// SoftPinAction: what a put or upsert does to the object's soft pin (Mooncake's values).
    "SoftPinAction" as PySoftPinAction { PRESERVE = 0, ENABLE = 1, DISABLE = 2 }
    /// ObjectDataType: Mooncake's classification of a value (accepted in `ReplicateConfig`; it
    /// does not change where or how Crescent stores it).
    "ObjectDataType" as PyObjectDataType {
        UNKNOWN = 0, KVCACHE = 1, TENSOR = 2, WEIGHT = 3, SAMPLE = 4, ACTIVATION = 5, GRADIENT = 6, OPTIMIZER_STATE = 7,
        METADATA = 8, GENERAL = 9,
    }
    /// ReplicaStatus of a replica descriptor (Mooncake's values).
    "ReplicaStatus" as PyReplicaStatus {
        UNDEFINED = 0, INITIALIZED = 1, PROCESSING = 2, COMPLETE = 3, REMOVED = 4, FAILED = 5,
    }
    /// TaskType of a replica task (Mooncake's values).
    "TaskType" as PyTaskType { REPLICA_COPY = 0, REPLICA_MOVE = 1 }
    /// TaskStatus of a replica task (Mooncake's values: FAILED is 2, SUCCESS 3).
    "TaskStatus" as PyTaskStatus { PENDING = 0, PROCESSING = 1, FAILED = 2, SUCCESS = 3 }
}
