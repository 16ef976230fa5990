//! TEMPORARY stand-in for coord-core's run-time idempotency handle, until it lands: the same
//! method names, calling coord-core's own runtime. Deleted at the merge.
#![allow(missing_docs, dead_code)]

use std::future::Future;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use coord_core::__private::{Call, IdempotencySpec, OnMissingKey, OpSpec};
use coord_core::{
    CallReport, CoordError, Coordinator, Fingerprint, OnAbandoned, OnBackendError, OnStoreError,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub(crate) trait HandleShim {
    fn key(&self, operation: &str) -> ShimKeyBuilder;
    fn idempotent(&self, key: ShimKey) -> ShimIdempotent<'_>;
}

pub(crate) struct ShimKeyBuilder {
    op: String,
    parts: Vec<String>,
}

impl ShimKeyBuilder {
    pub(crate) fn part(mut self, part: &str) -> Self {
        self.parts.push(part.to_owned());
        self
    }
    pub(crate) fn finish(self) -> ShimKey {
        ShimKey {
            op: self.op,
            parts: self.parts,
        }
    }
}

pub(crate) struct ShimKey {
    op: String,
    parts: Vec<String>,
}

impl HandleShim for Coordinator {
    fn key(&self, operation: &str) -> ShimKeyBuilder {
        ShimKeyBuilder {
            op: operation.to_owned(),
            parts: Vec::new(),
        }
    }
    fn idempotent(&self, key: ShimKey) -> ShimIdempotent<'_> {
        ShimIdempotent {
            coord: self,
            key,
            retention: Duration::from_secs(86400),
            lease: Duration::from_secs(30),
            wait: Duration::ZERO,
            on_abandoned: OnAbandoned::Rerun,
            on_backend_error: None,
            on_store_error: OnStoreError::Error,
            fingerprint: None,
        }
    }
}

pub(crate) struct ShimIdempotent<'c> {
    coord: &'c Coordinator,
    key: ShimKey,
    retention: Duration,
    lease: Duration,
    wait: Duration,
    on_abandoned: OnAbandoned,
    on_backend_error: Option<OnBackendError>,
    on_store_error: OnStoreError,
    fingerprint: Option<Fingerprint>,
}

impl ShimIdempotent<'_> {
    pub(crate) fn retention(mut self, d: Duration) -> Self {
        self.retention = d;
        self
    }
    pub(crate) fn in_flight_lease(mut self, d: Duration) -> Self {
        self.lease = d;
        self
    }
    pub(crate) fn wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }
    pub(crate) fn on_abandoned(mut self, p: OnAbandoned) -> Self {
        self.on_abandoned = p;
        self
    }
    pub(crate) fn on_backend_error(mut self, p: OnBackendError) -> Self {
        self.on_backend_error = Some(p);
        self
    }
    pub(crate) fn on_store_error(mut self, p: OnStoreError) -> Self {
        self.on_store_error = p;
        self
    }
    pub(crate) fn fingerprint(mut self, fp: Fingerprint) -> Self {
        self.fingerprint = Some(fp);
        self
    }

    /// Leaks one spec per distinct option set (a handful per test process).
    fn spec(&self) -> &'static OpSpec {
        static SPECS: OnceLock<Mutex<Vec<&'static OpSpec>>> = OnceLock::new();
        let specs = SPECS.get_or_init(Default::default);
        let mut specs = specs.lock().unwrap();
        let want = format!(
            "{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
            self.key.op,
            self.retention,
            self.lease,
            self.wait,
            self.on_abandoned,
            self.on_backend_error,
            self.on_store_error
        );
        for spec in specs.iter() {
            let i = spec.idempotency.as_ref().unwrap();
            let have = format!(
                "{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
                spec.name,
                i.retention,
                i.in_flight_lease,
                i.wait,
                i.on_abandoned,
                i.on_backend_error,
                i.on_store_error
            );
            if have == want {
                return spec;
            }
        }
        let spec: &'static OpSpec = Box::leak(Box::new(OpSpec {
            name: Box::leak(self.key.op.clone().into_boxed_str()),
            idempotency: Some(IdempotencySpec {
                retention: self.retention,
                in_flight_lease: self.lease,
                wait: self.wait,
                on_backend_error: self.on_backend_error,
                renew: None,
                on_lost: None,
                on_abandoned: self.on_abandoned,
                on_store_error: self.on_store_error,
                on_missing_key: OnMissingKey::Fail,
            }),
            lock: None,
        }));
        specs.push(spec);
        spec
    }

    pub(crate) async fn run_reported<T, E, F, Fut>(self, body: F) -> (Result<T, E>, CallReport)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<CoordError>,
    {
        let spec = self.spec();
        let parts = self.key.parts.clone();
        let coord = self.coord;
        let fp = self.fingerprint;
        coord_core::observe(async move {
            let call = Call::new(spec, coord, |mut k| {
                for p in &parts {
                    k = k.part(p.as_str());
                }
                k
            });
            call.run(coord_core::__private::idempotent(&call, fp.map(Ok), body()))
                .await
        })
        .await
    }
}
