//! How the runtime tells success from failure: by matching the value, not by the type's name.

use crate::error::CoordError;

/// The return type of a function under `#[idempotent]` or `#[distributed_lock]`.
///
/// Implemented for every `Result<T, E>` with `E: From<CoordError>`, so type aliases of
/// `Result` work. Success is decided by matching `Ok(_)`.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` and `#[distributed_lock]` need the function to return `Result<T, E>` where `E: From<coord_core::CoordError>`; `{Self}` is not such a type",
    label = "this return type cannot carry a `CoordError`",
    note = "return a `Result` whose error type implements `From<coord_core::CoordError>` (for instance `coord_core::CoordError` itself, or your own error enum with a variant wrapping it)"
)]
pub trait GuardedResult: Sized {
    /// The success type.
    type Ok;
    /// Builds the error value for a refusal coord decided on.
    fn from_coord_error(err: CoordError) -> Self;
    /// The success value, if this is a success.
    fn ok_ref(&self) -> Option<&Self::Ok>;
    /// Wraps a replayed success value.
    fn from_ok(ok: Self::Ok) -> Self;
}

impl<T, E: From<CoordError>> GuardedResult for Result<T, E> {
    type Ok = T;

    fn from_coord_error(err: CoordError) -> Self {
        Err(E::from(err))
    }

    fn ok_ref(&self) -> Option<&T> {
        self.as_ref().ok()
    }

    fn from_ok(ok: T) -> Self {
        Ok(ok)
    }
}

/// Compile-time check emitted by the macros at the return type, so a wrong return type is
/// reported at the user's tokens rather than inside generated code.
pub const fn assert_guarded_result<R: GuardedResult>() {}

/// Compile-time check for `#[single_flight]`: the outcome is handed to every joined caller.
pub const fn assert_shareable_output<R: Clone + Send + 'static>() {}
