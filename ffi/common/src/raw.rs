//! What the two C interfaces share about a call from C: the call run with its panic caught
//! (never unwound into C), and raw arrays checked before they become slices.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f` with this thread's last error cleared; a panic inside it is caught and given as
/// `Err(message)`.
pub fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    crate::clear_last_error();
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
        let text = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        format!("internal error (panic): {text}")
    })
}

/// Why a raw array was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadArray {
    /// A null pointer with elements to read.
    Null,
    /// More elements than an allocation can hold.
    TooMany(usize),
}

impl BadArray {
    /// The message for the argument `what`, `null` the interface's word for a null pointer.
    pub fn message(self, what: &str, null: &str) -> String {
        match self {
            BadArray::Null => format!("{what} is {null}"),
            BadArray::TooMany(count) => format!("{what}: {count} elements is too many"),
        }
    }
}

/// Checks `count` elements at `p` (null allowed only when `count` is 0).
fn check<T>(null: bool, count: usize) -> Result<(), BadArray> {
    if null {
        return Err(BadArray::Null);
    }
    if count.checked_mul(size_of::<T>()).is_none_or(|b| b > isize::MAX as usize) {
        return Err(BadArray::TooMany(count));
    }
    Ok(())
}

/// `count` elements at `p`.
///
/// # Safety
/// `p` points to `count` initialised elements that outlive `'a`.
pub unsafe fn slice<'a, T>(p: *const T, count: usize) -> Result<&'a [T], BadArray> {
    if count == 0 {
        return Ok(&[]);
    }
    check::<T>(p.is_null(), count)?;
    // SAFETY: non-null, `count` elements per the caller's contract, size checked above.
    Ok(unsafe { std::slice::from_raw_parts(p, count) })
}

/// `count` writable elements at `p`.
///
/// # Safety
/// `p` points to `count` writable elements that outlive `'a` and nothing else aliases them.
pub unsafe fn slice_mut<'a, T>(p: *mut T, count: usize) -> Result<&'a mut [T], BadArray> {
    if count == 0 {
        return Ok(&mut []);
    }
    check::<T>(p.is_null(), count)?;
    // SAFETY: non-null, `count` writable unaliased elements per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, count) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_are_checked_before_they_are_read() {
        // SAFETY: no element is read: a count of 0, or a null pointer that is refused.
        unsafe {
            assert_eq!(slice::<u8>(std::ptr::null(), 0), Ok(&[][..]));
            assert_eq!(slice::<u8>(std::ptr::null(), 1), Err(BadArray::Null));
            assert_eq!(slice_mut::<u64>(std::ptr::null_mut(), 3).err(), Some(BadArray::Null));
        }
        let data = [1u32, 2, 3];
        // SAFETY: `data` holds 3 elements and outlives the slice.
        assert_eq!(unsafe { slice(data.as_ptr(), 3) }, Ok(&data[..]));
        let p = std::ptr::NonNull::<u64>::dangling().as_ptr();
        // SAFETY: refused before anything is read: the size does not fit an allocation.
        assert_eq!(unsafe { slice(p, usize::MAX / 2) }, Err(BadArray::TooMany(usize::MAX / 2)));
        assert_eq!(BadArray::Null.message("keys", "NULL"), "keys is NULL");
        assert_eq!(BadArray::TooMany(9).message("keys", "null"), "keys: 9 elements is too many");
    }

    #[test]
    fn a_panic_is_caught_with_its_message() {
        crate::set_last_error("earlier");
        assert_eq!(guarded(|| 7), Ok(7));
        assert_eq!(crate::last_error(), "");
        let r = guarded(|| -> i32 { panic!("boom") });
        assert_eq!(r, Err("internal error (panic): boom".to_string()));
    }
}
