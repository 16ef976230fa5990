// Each of the three scope choices gives a builder that builds, before or after other options.
use coord_core::Coordinator;
use coord_http::{IdempotencyLayer, IdempotencyLayerBuilder, ScopeSet};
use http::header::AUTHORIZATION;

fn coordinator() -> Coordinator {
    Coordinator::builder()
        .namespace("payments")
        .memory()
        .build()
        .unwrap()
}

fn configured(builder: IdempotencyLayerBuilder<ScopeSet>) -> IdempotencyLayer {
    builder.require_key(false).build()
}

fn main() {
    let _by_function = IdempotencyLayer::builder(coordinator())
        .scope(|request| request.uri.host().unwrap_or("none").to_owned())
        .build();
    let _by_header = IdempotencyLayer::builder(coordinator())
        .operation("payments.http")
        .scope_header(AUTHORIZATION)
        .build();
    let _one_principal = configured(IdempotencyLayer::builder(coordinator()).single_principal());
}
