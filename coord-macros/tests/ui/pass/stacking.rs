// Guards: stacked attributes in any order, with paths, next to foreign attributes (kept in
// their order), and sharing options given on one layer only.
use coord_core::{CoordError, distributed_lock, idempotent, single_flight};

#[derive(Debug, Clone)]
pub struct AppError;

impl From<CoordError> for AppError {
    fn from(_: CoordError) -> Self {
        AppError
    }
}

/// Lock written first, idempotency last.
#[distributed_lock(lease = "5m")]
#[allow(clippy::needless_pass_by_value)]
#[single_flight]
#[cfg(all())]
#[idempotent(key_from = "id", name = "jobs.run")]
pub async fn run(id: String) -> Result<u64, AppError> {
    Ok(id.len() as u64)
}

#[coord_core::single_flight(key_from = ["tenant", "day"])]
#[tracing::instrument(skip_all)]
#[coord_core::idempotent(key_from = ["tenant", "day"], fingerprint = "day")]
pub async fn report(tenant: u64, day: u32) -> Result<u64, AppError> {
    Ok(tenant + u64::from(day))
}

#[tracing::instrument]
#[distributed_lock(key_from = "tenant", fenced = true, on_backend_error = "fail_open")]
pub async fn rebuild(tenant: u64) -> Result<(), AppError> {
    Ok(())
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert_eq!(run("abc".to_owned()).await.unwrap(), 3);
        assert_eq!(report(1, 2).await.unwrap(), 3);
        rebuild(4).await.unwrap();
    });
}
