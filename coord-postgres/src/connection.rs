//! Connections: settings as tokio-postgres reads them, TLS, the pools (the provider's own,
//! whose connections keep their prepared statements in slots, and an application's), the
//! runtime that drives every connection of the provider's own ([`Drivers`]), and the one way a
//! statement is sent ([`Link::query`]), bounded by the command timeout.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use coord_core::BackendError;
use coord_core::provider::BackendErrorKind;
use deadpool::managed::{Metrics, RecycleError, RecycleResult};
use deadpool_postgres::{Pool, Runtime};
use futures_util::future::BoxFuture;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};

use crate::errors::{backend_error, breaks_connection};
use crate::sql::Sql;

/// The longest lease, retention or keep period written: 2^46 ms, about 2230 years (far inside
/// what `timestamptz` holds, and exact as a double).
pub(crate) const MAX_MILLIS: u64 = 1 << 46;

fn config_error(message: impl Into<String>) -> BackendError {
    BackendError::new(BackendErrorKind::Config, message)
}

/// How connections are secured.
#[derive(Clone)]
pub(crate) enum Tls {
    None,
    #[cfg(feature = "tls")]
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// Settings for connections: tokio-postgres's, the TLS connector, and the address to name in
/// errors.
pub(crate) struct Settings {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) tls: Tls,
    pub(crate) address: String,
}

/// The runtime that drives the connections of one provider: one thread of its own running a
/// current-thread tokio runtime, for as long as any clone of this handle lives (the provider,
/// its pool's connector and its listener hold one).
///
/// Why not the caller's runtime: a connection is made by whichever call first needs it, and
/// the tasks that read and write its socket would live on that call's runtime. A pooled
/// connection is then shared with calls on other runtimes, and dies (or freezes) under them
/// when its maker's runtime is dropped (or blocked). Connections made and driven here serve
/// every runtime alike.
#[derive(Clone)]
pub(crate) struct Drivers {
    handle: Handle,
    /// Dropped with the last clone: the thread's `block_on` returns and its runtime, with every
    /// connection task still on it, is dropped there.
    _running: Arc<tokio::sync::oneshot::Sender<()>>,
}

impl Drivers {
    /// Starts the thread and its runtime.
    pub(crate) fn start() -> Result<Drivers, BackendError> {
        let unavailable = |e: std::io::Error| {
            BackendError::new(
                BackendErrorKind::Unavailable,
                format!("starting the thread that drives PostgreSQL connections: {e}"),
            )
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(unavailable)?;
        let handle = runtime.handle().clone();
        let (running, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("coord-postgres-io".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    // Never sent: resolves when the last handle is dropped.
                    let _ = stopped.await;
                });
            })
            .map_err(unavailable)?;
        Ok(Drivers {
            handle,
            _running: Arc::new(running),
        })
    }

    /// Runs `task` on the drivers' runtime.
    pub(crate) fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(task)
    }

    /// Awaits `task` run on the drivers' runtime (the socket it opens is registered with that
    /// runtime's reactor, so the connection it makes keeps working when the caller's runtime
    /// stops). A panic in `task` is resumed here.
    pub(crate) async fn run<F>(&self, task: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.handle.spawn(task).await {
            Ok(output) => output,
            Err(err) => match err.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                // Only a runtime shutting down cancels a task, and this runtime runs until
                // `self` (held across this await) is dropped.
                Err(err) => std::panic::resume_unwind(Box::new(format!(
                    "the runtime driving PostgreSQL connections stopped while in use: {err}"
                ))),
            },
        }
    }
}

/// Opens a connection and spawns its task on the current runtime (called on the drivers').
async fn open<T>(
    config: tokio_postgres::Config,
    tls: T,
) -> Result<(Client, JoinHandle<()>), tokio_postgres::Error>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket> + Send + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as tokio_postgres::tls::TlsConnect<tokio_postgres::Socket>>::Future: Send,
{
    let (client, connection) = config.connect(tls).await?;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((client, task))
}

/// The provider's own pool: connections made and driven on the provider's [`Drivers`],
/// whichever runtime the call that needs one runs on, each keeping its prepared statements.
pub(crate) type OwnPool = deadpool::managed::Pool<OwnManager>;

/// Makes and checks the connections of the provider's own pool.
pub(crate) struct OwnManager {
    config: tokio_postgres::Config,
    drivers: Drivers,
    tls: Tls,
}

/// A connection of the provider's own pool: the client, the task on the drivers' runtime that
/// reads and writes its socket (aborted with it), and the statements prepared on it, each in
/// its statement's slot ([`Sql::slot`]).
pub(crate) struct OwnConnection {
    client: Client,
    prepared: Vec<Option<Statement>>,
    task: JoinHandle<()>,
}

impl Drop for OwnConnection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OwnConnection {
    /// `sql` prepared on this connection: from its slot, or prepared now and kept there.
    async fn prepared(&mut self, sql: &Sql) -> Result<&Statement, tokio_postgres::Error> {
        let slot = sql.slot();
        if self.prepared.get(slot).is_none_or(Option::is_none) {
            let statement = boxed_prepare(&self.client, sql.text()).await?;
            if self.prepared.len() <= slot {
                self.prepared.resize(slot + 1, None);
            }
            self.prepared[slot] = Some(statement);
        }
        Ok(self.prepared[slot].as_ref().expect("prepared just now"))
    }
}

impl OwnManager {
    /// Opens a connection on the drivers' runtime. Boxed by a function of its own: the pool's
    /// checkout future holds this one, and every statement's future holds the checkout's, so
    /// unboxed (or boxed inline, where a moved-from temporary keeps its slot across the await)
    /// every statement would carry and move the space of a whole connection handshake (about
    /// 17 kB; measured as a copy of that size per statement).
    fn opening(&self) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), tokio_postgres::Error>> {
        let config = self.config.clone();
        match self.tls.clone() {
            Tls::None => Box::pin(self.drivers.run(open(config, NoTls))),
            #[cfg(feature = "tls")]
            Tls::Rustls(tls) => Box::pin(self.drivers.run(open(config, tls))),
        }
    }
}

/// `client.prepare(text)`, boxed by a function of its own: preparing happens once per
/// statement and connection, and its future is large; unboxed, or boxed inline (where a
/// moved-from temporary keeps its slot across the await), every statement's future would
/// carry and move that space.
fn boxed_prepare<'a>(
    client: &'a Client,
    text: &'a str,
) -> BoxFuture<'a, Result<Statement, tokio_postgres::Error>> {
    Box::pin(client.prepare(text))
}

impl deadpool::managed::Manager for OwnManager {
    type Type = OwnConnection;
    type Error = tokio_postgres::Error;

    async fn create(&self) -> Result<OwnConnection, tokio_postgres::Error> {
        let (client, task) = self.opening().await?;
        Ok(OwnConnection {
            client,
            prepared: Vec::new(),
            task,
        })
    }

    /// A connection whose task has seen its socket end is not given out again.
    async fn recycle(
        &self,
        connection: &mut OwnConnection,
        _: &Metrics,
    ) -> RecycleResult<tokio_postgres::Error> {
        if connection.client.is_closed() {
            return Err(RecycleError::message("the connection is closed"));
        }
        Ok(())
    }
}

impl Settings {
    /// The pool of a provider: connections made and driven on `drivers`.
    pub(crate) fn pool(
        &self,
        size: usize,
        timeout: Duration,
        drivers: &Drivers,
    ) -> Result<OwnPool, BackendError> {
        let manager = OwnManager {
            config: self.config.clone(),
            drivers: drivers.clone(),
            tls: self.tls.clone(),
        };
        OwnPool::builder(manager)
            .max_size(size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(timeout))
            .create_timeout(Some(timeout))
            .recycle_timeout(Some(timeout))
            .build()
            .map_err(|e| config_error(format!("making the connection pool: {e}")))
    }

    /// One connection of its own, its connection task spawned on the current runtime (for
    /// work that ends before the call that made it returns: migrating).
    pub(crate) async fn connect_one(&self) -> Result<Client, tokio_postgres::Error> {
        match &self.tls {
            Tls::None => {
                let (client, connection) = self.config.connect(NoTls).await?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Ok(client)
            }
            #[cfg(feature = "tls")]
            Tls::Rustls(tls) => {
                let (client, connection) = self.config.connect(tls.clone()).await?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Ok(client)
            }
        }
    }
}

/// The URL as tokio-postgres reads it. libpq's `sslmode=verify-ca` and `verify-full`, which
/// tokio-postgres does not know, are read as `require`: coord's TLS always verifies the
/// certificate chain and the host name, as `verify-full` does.
pub(crate) fn parse_url(url: &str) -> Result<tokio_postgres::Config, BackendError> {
    let text = url
        .trim()
        .replace("sslmode=verify-full", "sslmode=require")
        .replace("sslmode=verify-ca", "sslmode=require");
    tokio_postgres::Config::from_str(&text).map_err(|e| {
        config_error(format!(
            "the PostgreSQL URL is not valid ({e}): use postgres://user[:password]@host[:port]/database[?sslmode=..] \
             or the key=value form (host=.. dbname=..)"
        ))
    })
}

/// `host:port/database` (hosts and ports joined by commas), never the password.
pub(crate) fn describe(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(name) => name.clone(),
            Host::Unix(path) => format!("unix:{}", path.display()),
        })
        .collect();
    let hosts = if hosts.is_empty() {
        "localhost".to_owned()
    } else {
        hosts.join(",")
    };
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    let port = if ports.is_empty() {
        "5432".to_owned()
    } else {
        ports.join(",")
    };
    let db = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    format!("{hosts}:{port}/{db}")
}

/// The error of a pool that gave no connection.
pub(crate) fn pool_error(
    err: &deadpool_postgres::PoolError,
    what: &str,
    address: &str,
    timeout: Duration,
) -> BackendError {
    use deadpool_postgres::PoolError;
    match err {
        PoolError::Timeout(_) => BackendError::new(
            BackendErrorKind::Timeout,
            format!(
                "{what} at {address}: no connection within {timeout:?} (the server is slow or unreachable, or every pooled connection is busy)"
            ),
        ),
        PoolError::Backend(err) => backend_error(err, what, address),
        PoolError::Closed => BackendError::new(
            BackendErrorKind::Unavailable,
            format!("{what} at {address}: the connection pool is closed"),
        ),
        other => BackendError::new(
            BackendErrorKind::Unavailable,
            format!("{what} at {address}: {other}"),
        ),
    }
}

/// Statements whose callers went away while they were in flight, not yet known to be done.
///
/// A caller that drops its call cancels only the wait here: a statement already handed to the
/// connection's task reaches the server and runs. The clean-up that follows (a background
/// release, an abandon) goes out on another connection and could overtake it, so that an
/// acquire lands after its own release. Every statement therefore first waits until the
/// cancelled ones have been answered (each for at most the command timeout).
#[derive(Default)]
pub(crate) struct Drains {
    pending: std::sync::atomic::AtomicUsize,
    settled: tokio::sync::Notify,
}

impl Drains {
    /// Returns once no cancelled statement is in flight.
    async fn settled(&self) {
        use std::sync::atomic::Ordering;
        while self.pending.load(Ordering::Acquire) > 0 {
            let notified = self.settled.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Where a provider's connections come from.
pub(crate) enum Connections {
    /// Its own pool: statements are found on a connection by their slot.
    Own(OwnPool),
    /// An application's pool, whose connections may serve other providers (other schemas)
    /// and the application too: statements are found by their text (deadpool's cache).
    Application(Pool),
}

impl Connections {
    /// A connection, waiting for one at most as long as the pool was told.
    pub(crate) async fn get(&self) -> Result<Pooled, deadpool_postgres::PoolError> {
        match self {
            Connections::Own(pool) => pool.get().await.map(Pooled::Own),
            Connections::Application(pool) => pool.get().await.map(Pooled::Application),
        }
    }
}

/// A connection taken from [`Connections`]; dropping it gives it back.
pub(crate) enum Pooled {
    Own(deadpool::managed::Object<OwnManager>),
    Application(deadpool_postgres::Object),
}

impl std::ops::Deref for Pooled {
    type Target = Client;

    fn deref(&self) -> &Client {
        match self {
            Pooled::Own(object) => &object.client,
            Pooled::Application(object) => object,
        }
    }
}

impl Pooled {
    /// Runs `sql`, prepared once per connection.
    async fn query(
        &mut self,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match self {
            Pooled::Own(object) => {
                let connection = &mut **object;
                let statement = connection.prepared(sql).await?.clone();
                connection.client.query(&statement, params).await
            }
            Pooled::Application(object) => {
                let statement = object.prepare_cached(sql.text()).await?;
                object.query(&statement, params).await
            }
        }
    }

    /// Takes the connection out of its pool and drops it: its socket is closed.
    fn close(self) {
        match self {
            Pooled::Own(object) => drop(deadpool::managed::Object::take(object)),
            Pooled::Application(object) => drop(deadpool_postgres::Object::take(object)),
        }
    }
}

/// A pooled connection checked out for one statement. Given back to the pool after an
/// answer; closed after a timeout or a broken connection (a late answer on its way would be
/// read by the next statement instead of its own); drained then closed when the caller went
/// away with the statement in flight (see [`Drains`]).
struct Checkout<'l> {
    object: Option<Pooled>,
    link: &'l Link,
    timed_out: &'l std::sync::atomic::AtomicBool,
}

impl Checkout<'_> {
    fn give_back(mut self) {
        // Dropping the object returns it to the pool.
        drop(self.object.take());
    }

    fn close(mut self) {
        if let Some(object) = self.object.take() {
            // Closes the connection (its task is aborted with it).
            object.close();
        }
    }
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        let Some(object) = self.object.take() else {
            return;
        };
        if self.timed_out.load(Ordering::Relaxed) {
            object.close();
            return;
        }
        // The caller went away: statements sent from now on wait until the server has
        // answered this connection's last one (an empty query queued behind it), then it is
        // closed.
        let drains = self.link.drains.clone();
        drains.pending.fetch_add(1, Ordering::AcqRel);
        let timeout = self.link.timeout;
        self.link.drivers.spawn(async move {
            let _ = tokio::time::timeout(timeout, object.simple_query("")).await;
            object.close();
            drains.pending.fetch_sub(1, Ordering::AcqRel);
            drains.settled.notify_waiters();
        });
    }
}

/// Statements over a pool, each bounded by the command timeout.
pub(crate) struct Link {
    pub(crate) connections: Connections,
    pub(crate) timeout: Duration,
    /// `host:port/database`, never a password.
    pub(crate) address: String,
    /// Where cancelled statements are drained.
    pub(crate) drivers: Drivers,
    pub(crate) drains: Arc<Drains>,
}

impl Link {
    /// Runs one statement (prepared once per connection) and returns its rows. Everything,
    /// from taking a pooled connection to reading the last row, is bounded by the command
    /// timeout; after a timeout or a broken connection, that connection is closed rather than
    /// reused, and after a cancellation it is closed once its statement is answered (statements
    /// wait for that, so none overtakes a cancelled one).
    pub(crate) async fn query(
        &self,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
        what: &str,
    ) -> Result<Vec<Row>, BackendError> {
        let timed_out = std::sync::atomic::AtomicBool::new(false);
        let run = async {
            self.drains.settled().await;
            let object = self
                .connections
                .get()
                .await
                .map_err(|e| pool_error(&e, what, &self.address, self.timeout))?;
            let mut checkout = Checkout {
                object: Some(object),
                link: self,
                timed_out: &timed_out,
            };
            let object = checkout.object.as_mut().expect("checked out");
            let outcome = object.query(sql, params).await;
            let client: &Client = checkout.object.as_ref().expect("checked out");
            match outcome {
                Ok(rows) => {
                    checkout.give_back();
                    Ok(rows)
                }
                Err(err) => {
                    if !breaks_connection(&err) && !client.is_closed() {
                        checkout.give_back();
                    } else {
                        checkout.close();
                    }
                    Err(backend_error(&err, what, &self.address))
                }
            }
        };
        let mut run = std::pin::pin!(run);
        tokio::select! {
            biased;
            outcome = &mut run => outcome,
            () = tokio::time::sleep(self.timeout) => {
                // Read by the checkout's drop, when `run` is dropped on return.
                timed_out.store(true, std::sync::atomic::Ordering::Relaxed);
                Err(BackendError::new(
                    BackendErrorKind::Timeout,
                    format!(
                        "{what} at {}: no answer within {:?}",
                        self.address, self.timeout
                    ),
                ))
            }
        }
    }
}
