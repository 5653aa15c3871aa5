//! The service in a world, as `serve` builds it: the provider over a cloud, the drain
//! engine on an API server (behind DeleteNodes or not), and CA's door to it in
//! process or over TCP. The demo, the benchmarks (loadgen) and the tests build theirs
//! here, on the ground of [`crate::sim::world`] or on any cloud and API server.
//!
//! It sits above `sim` (the fake may not run the code it tests) and the layers it
//! assembles; nothing in the service uses it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::cloud::{Cloud, GroupSelector, TagFilter};
use crate::proto::cloud_provider_client::CloudProviderClient;
use crate::provider::{Provider, ProviderSettings};
use crate::scalein::{DrainScaleIn, Engine, ScaleInSettings};
use crate::sim::world::Ground;

/// CA's gRPC client.
pub type Ca = CloudProviderClient<Channel>;

/// What [`ServiceBuilder::build`] starts: see its setters.
pub struct ServiceBuilder {
    client: kube::Client,
    cloud: Arc<dyn Cloud>,
    selector: GroupSelector,
    refresh_interval: Duration,
    scale_in: ScaleInSettings,
    drain_behind_delete: bool,
    background: bool,
}

/// The provider and the drain engine of one process of the service.
pub struct Service {
    pub provider: Arc<Provider>,
    pub engine: Arc<Engine>,
}

/// The gRPC server on a free TCP port and CA's client to it. The server runs until
/// [`TcpDoor::close`] (a door dropped without it leaves the server running).
pub struct TcpDoor {
    pub ca: Ca,
    pub addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl ServiceBuilder {
    /// The service on `ground`: its groups by name, the engine as the API server's
    /// anonymous client.
    pub fn on(ground: &Ground) -> Self {
        Self::over(ground.sim.client(), Arc::new(ground.cloud.clone())).groups(&ground.groups)
    }

    /// The service over any API server (`client`, as the identity it runs as) and any
    /// cloud; no groups yet. The defaults: [`ProviderSettings`]' refresh interval,
    /// [`ScaleInSettings::default`], the drain behind DeleteNodes, refreshed once
    /// (no background loop).
    pub fn over(client: kube::Client, cloud: Arc<dyn Cloud>) -> Self {
        Self {
            client,
            cloud,
            selector: GroupSelector {
                names: vec![],
                tag_sets: vec![],
            },
            refresh_interval: ProviderSettings::default().refresh_interval,
            scale_in: ScaleInSettings::default(),
            drain_behind_delete: true,
            background: false,
        }
    }

    /// The identity the engine runs as on the API server.
    pub fn client(mut self, client: kube::Client) -> Self {
        self.client = client;
        self
    }

    /// The groups, by name (replaces those of [`ServiceBuilder::on`]).
    pub fn groups<S: AsRef<str>>(mut self, names: &[S]) -> Self {
        self.selector = named(names);
        self
    }

    /// The groups found by a tag key (auto-discovery), instead of by name.
    pub fn tagged(mut self, key: &str) -> Self {
        self.selector = tagged(&[key]);
        self
    }

    pub fn refresh_interval(mut self, d: Duration) -> Self {
        self.refresh_interval = d;
        self
    }

    pub fn scale_in(mut self, s: ScaleInSettings) -> Self {
        self.scale_in = s;
        self
    }

    /// Whether CA's DeleteNodes goes through the drain (`serve`'s way) or the engine
    /// is only there for the callers that hand it drains themselves.
    pub fn drain_behind_delete(mut self, on: bool) -> Self {
        self.drain_behind_delete = on;
        self
    }

    /// The provider refreshes in its background loop (`serve`'s way) instead of once
    /// before [`ServiceBuilder::build`] returns.
    pub fn background(mut self, on: bool) -> Self {
        self.background = on;
        self
    }

    pub async fn build(self) -> anyhow::Result<Service> {
        let settings = ProviderSettings {
            selector: self.selector,
            refresh_interval: self.refresh_interval,
            ..ProviderSettings::default()
        };
        let provider = Provider::new(self.cloud.clone(), settings);
        if self.background {
            provider.start_background();
        } else {
            provider.refresh_now().await?;
        }
        let engine = Engine::new(
            self.client,
            self.cloud,
            Some(provider.clone()),
            self.scale_in,
        );
        if self.drain_behind_delete {
            provider.set_scale_in(Arc::new(DrainScaleIn(engine.clone())));
        }
        Ok(Service { provider, engine })
    }
}

impl Service {
    /// CA's client to the gRPC server in process (no socket: for a case on tokio's
    /// paused clock).
    pub async fn ca_in_process(&self) -> anyhow::Result<Ca> {
        let channel = crate::grpc::in_process::serve(self.provider.clone()).await?;
        Ok(CloudProviderClient::new(channel))
    }

    /// The gRPC server on a free port of 127.0.0.1 and CA's client to it.
    pub async fn ca_over_tcp(&self) -> anyhow::Result<TcpDoor> {
        tcp_door(&self.provider).await
    }

    /// Waits until the provider has read the drain marks on the Nodes (it takes size
    /// changes from then on).
    pub async fn drain_marks_read(&self, limit: Duration) -> anyhow::Result<()> {
        crate::sim::world::until("the drain marks on Nodes are read", limit, || {
            self.provider.drain_state_known()
        })
        .await
    }
}

impl TcpDoor {
    /// Stops the server and waits for it to end.
    pub async fn close(self) {
        let _ = self.stop.send(());
        let _ = self.server.await;
    }
}

/// The provider alone (no drain behind DeleteNodes) over the groups of `cloud` that
/// `selector` picks, `serve`'s other settings, refreshed once.
pub async fn provider(
    cloud: Arc<dyn Cloud>,
    selector: GroupSelector,
) -> anyhow::Result<Arc<Provider>> {
    let provider = Provider::new(
        cloud,
        ProviderSettings {
            selector,
            ..ProviderSettings::default()
        },
    );
    provider.refresh_now().await?;
    Ok(provider)
}

/// The groups named `names` (a static list), no discovery.
pub fn named<S: AsRef<str>>(names: &[S]) -> GroupSelector {
    GroupSelector {
        names: names.iter().map(|n| n.as_ref().to_string()).collect(),
        tag_sets: vec![],
    }
}

/// Auto-discovery of the groups that carry every tag key of `keys`, whatever its
/// value (as `k8s.io/cluster-autoscaler/enabled` and the cluster's tag are used).
pub fn tagged(keys: &[&str]) -> GroupSelector {
    GroupSelector {
        names: vec![],
        tag_sets: vec![keys
            .iter()
            .map(|k| TagFilter {
                key: k.to_string(),
                value: None,
            })
            .collect()],
    }
}

/// The gRPC server over `provider` on a free port of 127.0.0.1 and CA's client to it.
pub async fn tcp_door(provider: &Arc<Provider>) -> anyhow::Result<TcpDoor> {
    let (listener, addr) = crate::grpc::bind("127.0.0.1:0".parse()?).await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(crate::grpc::serve(
        listener,
        provider.clone(),
        None,
        async move {
            // Dropped without [`TcpDoor::close`]: it serves on.
            if stopped.await.is_err() {
                std::future::pending::<()>().await
            }
        },
    ));
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await?;
    Ok(TcpDoor {
        ca: CloudProviderClient::new(channel),
        addr,
        stop,
        server,
    })
}
