//! The provider conformance suite (the cases the in-process and Redis providers pass) against
//! a real PostgreSQL server.

mod support;

async fn fresh_coordinator() -> coord_core::Coordinator {
    support::fresh_coordinator().await
}

coord_conformance::conformance_suite!(fresh_coordinator);
