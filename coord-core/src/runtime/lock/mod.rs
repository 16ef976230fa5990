//! The lock path: the `#[distributed_lock]` layer and the lock of the handle API, in three
//! files a call goes through in order.
//!
//! * [`acquire`]: taking the lock. The checks before any attempt, the one synchronous step
//!   (the in-process provider's table answers a free lock there, for the attribute and the
//!   handles alike), and the await of any other provider's answer, ending in a [`Grant`].
//! * [`guard`]: holding it and giving it back. [`LockGuard`] (the handle API's), `CallHold`
//!   (the attribute's), the owner-checked release both take, and what a release that finds
//!   the lock gone says about it.
//! * [`layer`]: the attribute's layer, [`distributed_lock`]: take, run the body as the holder
//!   (watched when the hold renews or cancels on loss), give back, recording each step.
//!
//! A semaphore permit (`permits = n`, `Coordinator::semaphore`) and a read-write hold
//! (`mode = ..`, `Coordinator::rw_lock`) go the same way: the same acquisition path, hold,
//! renewal, loss handling and guard, with their store in place of the lock provider (see
//! `HoldKind`). The files import downwards only: the layer uses the other two, the guard uses
//! the acquisition's [`Grant`], the acquisition uses neither.

mod acquire;
mod guard;
mod layer;

pub(crate) use acquire::{Acquired, Grant, acquire_lock};
pub use guard::LockGuard;
pub(crate) use guard::release_once;
pub use layer::distributed_lock;
