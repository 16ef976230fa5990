// A layer built without saying whose keys are whose does not compile (coord-http).
use coord_core::Coordinator;
use coord_http::IdempotencyLayer;

fn main() {
    let coordinator = Coordinator::builder()
        .namespace("payments")
        .memory()
        .build()
        .unwrap();
    let _layer = IdempotencyLayer::builder(coordinator)
        .operation("payments.http")
        .build();
}
