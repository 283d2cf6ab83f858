//! Twin methods: Mooncake's API names sets of methods that differ in one value only — the
//! write and the read of a transfer (the opcode), the put and the upsert of a value (the
//! store's table row). [`pymethods_with_twins!`] writes a class's `#[pymethods]` block with
//! such a set declared once: each twin keeps its own name, docstring and attributes; the
//! parameter list, the signature attribute they share and the body are written once.

/// A class's `#[pymethods]` block: the `impl` as written, then each set of twins
///
/// ```text
/// /// docstring of the first
/// fn first = VALUE_OF_THE_FIRST;
/// /// docstring of the second
/// fn second = VALUE_OF_THE_SECOND;
/// with name
/// #[pyo3(signature = (...))]
/// fn (&self, params...) -> Return { body using `name` }
/// ```
///
/// added to it: a method per twin with the parameters, signature and body given, `name` bound
/// to the twin's value.
macro_rules! pymethods_with_twins {
    (
        $(#[$impl_attr:meta])*
        impl $ty:ty { $($methods:tt)* }
        $(
            $(
                $(#[$attr:meta])*
                fn $name:ident = $value:expr;
            )+
            with $var:ident
            #[$signature:meta]
            fn $params:tt -> $ret:ty $body:block
        )*
    ) => {
        $(#[$impl_attr])*
        impl $ty {
            $($methods)*
            $($(
                $(#[$attr])*
                #[$signature]
                fn $name $params -> $ret {
                    let $var = $value;
                    $body
                }
            )+)*
        }
    };
}

pub(crate) use pymethods_with_twins;
