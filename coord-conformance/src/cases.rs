//! The cases, one `pub async fn` per promise of the provider contract, grouped in one module
//! per promise.
//!
//! Each case takes a fresh [`Coordinator`](coord_core::Coordinator) (its own namespace, so
//! cases never see each other's keys) and checks one promise, first through the provider
//! traits, then through the attributes themselves. A case passes by returning and fails by
//! panicking with a message that says which promise broke. Every case is also here, at
//! `cases::NAME`, whichever module it lives in: call them one by one when bisecting a failure;
//! otherwise run them through [`conformance_suite!`](crate::conformance_suite) or
//! [`run_all`](crate::run_all).
//!
//! Deadlines here are behavioural and generous: "woken by the release, not by a backstop" is
//! checked as "well under the one-second backstop cap", never as a tight latency.

pub mod attributes;
pub mod cache_store;
pub mod cancellation;
pub mod cluster_flights;
pub mod completion_outcomes;
pub mod fencing;
pub mod hostile_durations;
pub mod idempotency_records;
pub mod lock_exclusion;
pub mod lock_ownership;
pub mod multi_locks;
pub mod operations_api;
pub mod record_age;
pub mod rw_locks;
pub mod semaphores;
pub mod stalls;

mod deadlines;
mod durations;
mod records;
mod requests;

pub use attributes::{
    attribute_idempotent_duplicates_run_once, attribute_idempotent_errors_are_not_remembered,
    attribute_lock_excludes_and_fences, attribute_lock_refusal_and_cancellation,
};
pub use cache_store::{
    cache_delete_removes_the_entry, cache_entry_is_absent_after_its_ttl,
    cache_extreme_ttls_are_accepted, cache_is_separate_from_locks_and_records,
    cache_keys_of_other_operations_and_parts_do_not_collide,
    cache_set_replaces_the_value_and_the_ttl,
    cache_set_then_get_returns_the_bytes_and_the_ttl_left,
};
pub use cancellation::{
    cancellation_cached_shared_leaves_nothing, cancellation_flights_leave_nothing_registered,
    cancellation_idempotent_leaves_no_marker, cancellation_lock_leaves_no_holder,
};
pub use cluster_flights::{
    attribute_cluster_single_flight_runs_once_and_takes_over,
    flight_abandon_and_lapse_make_the_flight_vacant, flight_claim_is_exclusive_and_owner_scoped,
    flight_finish_hands_over_and_is_fenced,
    flight_finish_noting_sent_tells_no_later_than_the_answer,
};
pub use completion_outcomes::{
    idempotency_completion_after_purge_is_stored_without_marker,
    idempotency_completion_after_the_marker_lapsed_is_stored_without_it,
    idempotency_completion_by_the_owner_is_stored_and_resendable,
    idempotency_late_completion_after_another_claim_is_superseded,
};
pub use fencing::lock_fencing_tokens_increase_only_when_fenced;
pub use hostile_durations::{
    idempotency_extreme_durations_are_accepted,
    idempotency_forever_wait_settled_waits_until_settled,
    lock_cancelled_forever_waiter_leaves_the_key_working, lock_extreme_leases_are_accepted,
    lock_extreme_waits_wait_until_granted,
};
pub use idempotency_records::{
    idempotency_abandon_and_lapse, idempotency_abandoned_marker_is_kept_on_request,
    idempotency_claim_complete_replay, idempotency_claim_resent_by_its_owner_is_claimed,
    idempotency_end_marker_lease_keeps_it_as_abandoned,
    idempotency_renew_marker_reports_why_the_marker_was_lost,
    idempotency_transactional_marker_lapses_to_absent,
    idempotency_wait_settled_wakes_on_completion,
};
pub use lock_exclusion::{
    lock_expired_holder_is_replaced, lock_release_wakes_one_waiter,
    lock_single_attempt_refused_when_held, lock_waiter_is_woken_by_release,
};
pub use lock_ownership::{
    lock_release_is_owner_scoped_and_idempotent, lock_renew_is_owner_scoped,
    lock_renew_reports_why_the_lock_was_lost,
};
pub use multi_locks::{
    multi_lock_and_single_lock_on_an_overlapping_key_exclude_each_other,
    multi_lock_deadlock_by_order, multi_lock_keys_are_taken_in_canonical_order,
    multi_lock_partial_acquire_is_rolled_back, multi_lock_renewal_stops_at_release,
    multi_lock_tokens_are_readable_per_key, partial_state_after_an_interrupted_multi_acquire,
};
pub use operations_api::{
    inspection_of_semaphores_and_rw_locks_shows_live_holds,
    operations_force_release_frees_any_holder_and_wakes_a_waiter,
    operations_inspect_lock_shows_holder_lease_waiters_and_token,
    operations_inspect_record_in_each_state,
    operations_list_pages_through_the_keys_of_one_operation,
    operations_operator_acts_on_pasted_keys,
};
pub use record_age::idempotency_replay_reports_the_record_age;
pub use rw_locks::{
    read_release_does_not_delete_a_write_hold, rw_crashed_holders_and_waiting_writer_expire,
    rw_fencing_tokens_increase_across_modes, rw_readers_share_and_a_writer_is_alone,
    rw_renewal_stops_at_release, rw_upgrade_is_refused_at_once,
    rw_waiting_writer_keeps_new_readers_out,
};
pub use semaphores::{
    missed_release_notification_is_recovered_by_recheck,
    permit_released_after_it_expired_does_not_free_another, renewal_does_not_outlive_release,
    semaphore_crashed_holder_permit_returns_after_its_lease, semaphore_each_release_wakes_a_waiter,
    semaphore_fencing_tokens_increase, semaphore_limit_is_exact_under_races,
    semaphore_release_and_renew_are_owner_scoped, semaphore_try_acquire_when_full,
};
pub use stalls::{
    stall_cache_local_serves_nothing_older_than_its_ttl,
    stall_cache_shared_serves_nothing_older_than_its_ttl,
    stall_cache_two_tier_serves_nothing_older_than_its_ttl, stall_renewing_lock_ends_in_lock_lost,
    stall_signalled_lock_shows_and_reports_the_loss, stall_unrenewed_lock_reports_the_lapse,
};
