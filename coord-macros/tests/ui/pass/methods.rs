// Guards: methods with `&self`, `&mut self` and `self: Arc<Self>` receivers, with keys taken
// from `self` and from parameters, and a coordinator taken from `self`.
use std::sync::Arc;

use coord_core::{CoordError, Coordinator, distributed_lock, idempotent, single_flight};

pub struct Ledger {
    pub tenant: u64,
    pub coordinator: Coordinator,
    pub entries: Vec<u64>,
}

impl Ledger {
    #[single_flight(key_from = "self.tenant")]
    pub async fn total(&self) -> u64 {
        self.entries.iter().sum()
    }

    #[distributed_lock(key_from = ["self.tenant", "amount"], coordinator = self.coordinator)]
    pub async fn append(&mut self, amount: u64) -> Result<usize, CoordError> {
        self.entries.push(amount);
        Ok(self.entries.len())
    }

    // A `&self` method: the coordinator is borrowed from `self` for the call.
    #[distributed_lock(key_from = "self.tenant", coordinator = self.coordinator, name = "ledger.audit")]
    pub async fn audit(&self) -> Result<u64, CoordError> {
        Ok(self.entries.iter().sum())
    }

    #[idempotent(key_from = "request_id", coordinator = "self.coordinator")]
    pub async fn settle(self: Arc<Self>, request_id: String) -> Result<u64, CoordError> {
        let _ = request_id;
        Ok(self.entries.iter().sum())
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let coordinator = Coordinator::builder().memory().build().unwrap();
        let mut ledger = Ledger {
            tenant: 1,
            coordinator,
            entries: vec![],
        };
        assert_eq!(ledger.append(5).await.unwrap(), 1);
        assert_eq!(ledger.total().await, 5);
        assert_eq!(ledger.audit().await.unwrap(), 5);
        let ledger = Arc::new(ledger);
        assert_eq!(ledger.clone().settle("r1".to_owned()).await.unwrap(), 5);
    });
}
