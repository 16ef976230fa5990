// Guards: `scope = "cluster"` accepts a `Result` alias, methods (with `self` in the key),
// serialisable errors (handed over as themselves) and errors that are not (handed over as
// `LeaderFailed`), and borrowed parameters.
use coord_core::{CoordError, Coordinator, single_flight};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
enum ApiError {
    Upstream(String),
    Coord(String),
}

impl From<CoordError> for ApiError {
    fn from(err: CoordError) -> Self {
        ApiError::Coord(err.to_string())
    }
}

type ApiResult<T> = Result<T, ApiError>;

struct Prices {
    coord: Coordinator,
    region: String,
}

impl Prices {
    #[single_flight(key_from = ["self.region", symbol], scope = "cluster", coordinator = self.coord)]
    async fn quote(&self, symbol: &str) -> ApiResult<u64> {
        Ok(symbol.len() as u64)
    }

    #[single_flight(key_from = symbol, scope = "cluster", lease = "2s", coordinator = self.coord)]
    async fn opaque(&self, symbol: String) -> Result<Vec<String>, CoordError> {
        Ok(vec![symbol])
    }
}

fn main() {
    let prices = Prices {
        coord: Coordinator::builder().memory().build().unwrap(),
        region: "eu".to_owned(),
    };
    let _ = prices.quote("ACME");
    let _ = prices.opaque("ACME".to_owned());
    let _ = ApiError::Upstream(String::new());
}
