//! A cloud served to the soak's replicas, which run as processes of their own: the
//! driver keeps the one memory cloud (moto lacks the lifecycle wait states our hook
//! needs) and serves each replica's view of it on a loopback port; the replica's
//! [`Remote`] asks it, one call per connection, as a process asks AWS. A call the
//! server took on is carried out to its end even if the replica is killed meanwhile
//! (as AWS carries out a request whose caller died); a replica that cannot reach the
//! server gets a transient error (as from a network failure), never a made-up answer.
//!
//! The wire: one line of JSON each way, [`Request`] then `Result<T, Failure>`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ca_asg_provider::cloud::{
    AsgInstance, AsgSnapshot, Cloud, CloudError, CloudResult, EksNodegroup, GroupSelector,
    InstanceAddresses, InstanceLocation, InstanceRequirements, InstanceTypeInfo, LaunchData,
    LaunchHistory, LaunchTemplateRef, LifecycleAction, LifecycleHook, LifecycleResult, TargetGroup,
    TargetHealth,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The longest a call waits for its answer (the SDK's own timeouts play this part).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest request line the server reads.
const MAX_REQUEST: u64 = 1 << 20;

/// One call of [`Cloud`], its arguments owned.
#[derive(Debug, Serialize, Deserialize)]
enum Call {
    DescribeGroups(GroupSelector),
    LaunchHistory(String),
    LocateInstances(Vec<String>),
    EndedInstances(Vec<String>),
    SetDesiredCapacity(String, i32),
    WarmPoolInstances(String),
    TerminateInstance(String, bool),
    InstanceTypes(Vec<String>),
    LaunchTemplate(LaunchTemplateRef),
    LaunchConfiguration(String),
    TerminatingHooks(String),
    PutTerminatingHook(String, LifecycleHook),
    DeleteTerminatingHook(String, String),
    TagGroup(String, String, String),
    UntagGroup(String, String),
    LifecycleHeartbeat(LifecycleAction),
    CompleteLifecycleAction(LifecycleAction, LifecycleResult),
    EksNodegroup(String, String),
    InstanceTypesForRequirements(InstanceRequirements, Option<String>),
    TerminationCause(String, String),
    InstanceAddresses(String),
    TargetGroups,
    TargetHealth(String),
    DeregistrationDelay(String),
    GroupTargetGroups(String),
    DeregisterTargets(String, Vec<TargetHealth>),
}

/// A call, and whose view of the cloud answers it.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    who: String,
    call: Call,
}

/// [`CloudError`] on the wire (its `what` owned).
#[derive(Debug, Serialize, Deserialize)]
enum Failure {
    Throttled {
        operation: String,
        message: String,
    },
    Transient {
        operation: String,
        message: String,
    },
    Credentials {
        operation: String,
        message: String,
        hint: String,
    },
    NotFound {
        what: String,
        name: String,
    },
    Rejected {
        operation: String,
        code: String,
        message: String,
    },
}

impl From<CloudError> for Failure {
    fn from(e: CloudError) -> Self {
        match e {
            CloudError::Throttled { operation, message } => {
                Failure::Throttled { operation, message }
            }
            CloudError::Transient { operation, message } => {
                Failure::Transient { operation, message }
            }
            CloudError::Credentials {
                operation,
                message,
                hint,
            } => Failure::Credentials {
                operation,
                message,
                hint,
            },
            CloudError::NotFound { what, name } => Failure::NotFound {
                what: what.to_string(),
                name,
            },
            CloudError::Rejected {
                operation,
                code,
                message,
            } => Failure::Rejected {
                operation,
                code,
                message,
            },
        }
    }
}

impl From<Failure> for CloudError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Throttled { operation, message } => {
                CloudError::Throttled { operation, message }
            }
            Failure::Transient { operation, message } => {
                CloudError::Transient { operation, message }
            }
            Failure::Credentials {
                operation,
                message,
                hint,
            } => CloudError::Credentials {
                operation,
                message,
                hint,
            },
            Failure::NotFound { what, name } => CloudError::NotFound {
                what: interned(what),
                name,
            },
            Failure::Rejected {
                operation,
                code,
                message,
            } => CloudError::Rejected {
                operation,
                code,
                message,
            },
        }
    }
}

/// `what` as the `&'static str` [`CloudError::NotFound`] holds: each spelling leaked
/// once (a handful of kinds of thing).
fn interned(what: String) -> &'static str {
    static SEEN: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut seen = SEEN.lock().unwrap();
    if let Some(s) = seen.get(what.as_str()) {
        return s;
    }
    let s: &'static str = Box::leak(what.into_boxed_str());
    seen.insert(s);
    s
}

/// The driver's side: each replica's view of the cloud, by its name, on one port.
#[derive(Clone)]
pub struct Server {
    pub addr: SocketAddr,
    views: Arc<Mutex<BTreeMap<String, Arc<dyn Cloud>>>>,
}

impl Server {
    /// Listens on a loopback port of its own, answering on the current runtime.
    pub async fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port for the cloud");
        let server = Server {
            addr: listener.local_addr().unwrap(),
            views: Arc::default(),
        };
        let views = server.views.clone();
        tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                let views = views.clone();
                tokio::spawn(async move {
                    let _ = answer(conn, &views).await;
                });
            }
        });
        server
    }

    /// From now on `who`'s calls are answered by `cloud`.
    pub fn serve_as(&self, who: &str, cloud: Arc<dyn Cloud>) {
        self.views.lock().unwrap().insert(who.to_string(), cloud);
    }
}

/// Reads one request from `conn`, answers it, and closes.
async fn answer(
    conn: TcpStream,
    views: &Mutex<BTreeMap<String, Arc<dyn Cloud>>>,
) -> std::io::Result<()> {
    let (read, mut write) = conn.into_split();
    let mut line = String::new();
    BufReader::new(read.take(MAX_REQUEST))
        .read_line(&mut line)
        .await?;
    let mut answer = match serde_json::from_str::<Request>(&line) {
        Err(e) => refused("BadRequest", e.to_string()),
        Ok(request) => {
            let cloud = views.lock().unwrap().get(&request.who).cloned();
            match cloud {
                Some(cloud) => carry_out(cloud.as_ref(), request.call).await,
                None => refused("UnknownCaller", request.who),
            }
        }
    };
    answer.push('\n');
    write.write_all(answer.as_bytes()).await?;
    write.shutdown().await
}

/// A request the server cannot carry out, refused as a line of JSON.
fn refused(code: &str, message: String) -> String {
    to_line::<()>(Err(CloudError::Rejected {
        operation: "remote cloud".into(),
        code: code.into(),
        message,
    }))
}

/// `r` as a line of JSON (without its end).
fn to_line<T: Serialize>(r: CloudResult<T>) -> String {
    serde_json::to_string(&r.map_err(Failure::from)).unwrap()
}

/// The answer to `call` from `cloud`, as a line of JSON.
async fn carry_out(cloud: &dyn Cloud, call: Call) -> String {
    match call {
        Call::DescribeGroups(s) => to_line(cloud.describe_groups(&s).await),
        Call::LaunchHistory(g) => to_line(cloud.launch_history(&g).await),
        Call::LocateInstances(ids) => to_line(cloud.locate_instances(&ids).await),
        Call::EndedInstances(ids) => to_line(cloud.ended_instances(&ids).await),
        Call::SetDesiredCapacity(g, d) => to_line(cloud.set_desired_capacity(&g, d).await),
        Call::WarmPoolInstances(g) => to_line(cloud.warm_pool_instances(&g).await),
        Call::TerminateInstance(id, dec) => to_line(cloud.terminate_instance(&id, dec).await),
        Call::InstanceTypes(n) => to_line(cloud.instance_types(&n).await),
        Call::LaunchTemplate(t) => to_line(cloud.launch_template(&t).await),
        Call::LaunchConfiguration(n) => to_line(cloud.launch_configuration(&n).await),
        Call::TerminatingHooks(g) => to_line(cloud.terminating_hooks(&g).await),
        Call::PutTerminatingHook(g, h) => to_line(cloud.put_terminating_hook(&g, &h).await),
        Call::DeleteTerminatingHook(g, h) => to_line(cloud.delete_terminating_hook(&g, &h).await),
        Call::TagGroup(g, k, v) => to_line(cloud.tag_group(&g, &k, &v).await),
        Call::UntagGroup(g, k) => to_line(cloud.untag_group(&g, &k).await),
        Call::LifecycleHeartbeat(a) => to_line(cloud.lifecycle_heartbeat(&a).await),
        Call::CompleteLifecycleAction(a, r) => {
            to_line(cloud.complete_lifecycle_action(&a, r).await)
        }
        Call::EksNodegroup(c, n) => to_line(cloud.eks_nodegroup(&c, &n).await),
        Call::InstanceTypesForRequirements(r, image) => to_line(
            cloud
                .instance_types_for_requirements(&r, image.as_deref())
                .await,
        ),
        Call::TerminationCause(g, id) => to_line(cloud.termination_cause(&g, &id).await),
        Call::InstanceAddresses(id) => to_line(cloud.instance_addresses(&id).await),
        Call::TargetGroups => to_line(cloud.target_groups().await),
        Call::TargetHealth(arn) => to_line(cloud.target_health(&arn).await),
        Call::DeregistrationDelay(arn) => to_line(cloud.deregistration_delay(&arn).await),
        Call::GroupTargetGroups(g) => to_line(cloud.group_target_groups(&g).await),
        Call::DeregisterTargets(arn, t) => to_line(cloud.deregister_targets(&arn, &t).await),
    }
}

/// A replica's side: the cloud as the server at `addr` answers for `who`.
pub struct Remote {
    addr: SocketAddr,
    who: String,
}

impl Remote {
    pub fn new(addr: SocketAddr, who: &str) -> Remote {
        Remote {
            addr,
            who: who.to_string(),
        }
    }

    /// Sends `call` and reads its answer; a call that cannot reach the server or read
    /// its answer in time failed transiently (whether it took effect is not known, as
    /// with a timed-out AWS call).
    async fn ask<T: DeserializeOwned>(&self, call: Call) -> CloudResult<T> {
        let request = Request {
            who: self.who.clone(),
            call,
        };
        let exchange = async {
            let mut conn = TcpStream::connect(self.addr).await?;
            let mut line = serde_json::to_string(&request).map_err(std::io::Error::other)?;
            line.push('\n');
            conn.write_all(line.as_bytes()).await?;
            let mut answer = String::new();
            BufReader::new(conn).read_line(&mut answer).await?;
            serde_json::from_str::<Result<T, Failure>>(&answer).map_err(std::io::Error::other)
        };
        let message = match tokio::time::timeout(CALL_TIMEOUT, exchange).await {
            Ok(Ok(answer)) => return answer.map_err(CloudError::from),
            Ok(Err(e)) => format!("the cloud's server: {e}"),
            Err(_) => format!("the cloud's server gave no answer in {CALL_TIMEOUT:?}"),
        };
        Err(CloudError::Transient {
            operation: request.call.name(),
            message,
        })
    }
}

impl Call {
    /// The call's name (its variant), for an error.
    fn name(&self) -> String {
        let shown = format!("{self:?}");
        shown
            .split(['(', ' '])
            .next()
            .unwrap_or_default()
            .to_string()
    }
}

#[async_trait]
impl Cloud for Remote {
    async fn describe_groups(&self, selector: &GroupSelector) -> CloudResult<Vec<AsgSnapshot>> {
        self.ask(Call::DescribeGroups(selector.clone())).await
    }
    async fn launch_history(&self, group: &str) -> CloudResult<LaunchHistory> {
        self.ask(Call::LaunchHistory(group.into())).await
    }
    async fn locate_instances(&self, ids: &[String]) -> CloudResult<Vec<InstanceLocation>> {
        self.ask(Call::LocateInstances(ids.to_vec())).await
    }
    async fn ended_instances(&self, ids: &[String]) -> CloudResult<Vec<String>> {
        self.ask(Call::EndedInstances(ids.to_vec())).await
    }
    async fn set_desired_capacity(&self, group: &str, desired: i32) -> CloudResult<()> {
        self.ask(Call::SetDesiredCapacity(group.into(), desired))
            .await
    }
    async fn warm_pool_instances(&self, group: &str) -> CloudResult<Vec<AsgInstance>> {
        self.ask(Call::WarmPoolInstances(group.into())).await
    }
    async fn terminate_instance(&self, id: &str, decrement: bool) -> CloudResult<()> {
        self.ask(Call::TerminateInstance(id.into(), decrement))
            .await
    }
    async fn instance_types(&self, names: &[String]) -> CloudResult<Vec<InstanceTypeInfo>> {
        self.ask(Call::InstanceTypes(names.to_vec())).await
    }
    async fn launch_template(&self, t: &LaunchTemplateRef) -> CloudResult<LaunchData> {
        self.ask(Call::LaunchTemplate(t.clone())).await
    }
    async fn launch_configuration(&self, name: &str) -> CloudResult<LaunchData> {
        self.ask(Call::LaunchConfiguration(name.into())).await
    }
    async fn terminating_hooks(&self, group: &str) -> CloudResult<Vec<LifecycleHook>> {
        self.ask(Call::TerminatingHooks(group.into())).await
    }
    async fn put_terminating_hook(&self, group: &str, hook: &LifecycleHook) -> CloudResult<()> {
        self.ask(Call::PutTerminatingHook(group.into(), hook.clone()))
            .await
    }
    async fn delete_terminating_hook(&self, group: &str, hook: &str) -> CloudResult<()> {
        self.ask(Call::DeleteTerminatingHook(group.into(), hook.into()))
            .await
    }
    async fn tag_group(&self, group: &str, key: &str, value: &str) -> CloudResult<()> {
        self.ask(Call::TagGroup(group.into(), key.into(), value.into()))
            .await
    }
    async fn untag_group(&self, group: &str, key: &str) -> CloudResult<()> {
        self.ask(Call::UntagGroup(group.into(), key.into())).await
    }
    async fn lifecycle_heartbeat(&self, action: &LifecycleAction) -> CloudResult<()> {
        self.ask(Call::LifecycleHeartbeat(action.clone())).await
    }
    async fn complete_lifecycle_action(
        &self,
        action: &LifecycleAction,
        result: LifecycleResult,
    ) -> CloudResult<()> {
        self.ask(Call::CompleteLifecycleAction(action.clone(), result))
            .await
    }
    async fn eks_nodegroup(&self, cluster: &str, nodegroup: &str) -> CloudResult<EksNodegroup> {
        self.ask(Call::EksNodegroup(cluster.into(), nodegroup.into()))
            .await
    }
    async fn instance_types_for_requirements(
        &self,
        requirements: &InstanceRequirements,
        image_id: Option<&str>,
    ) -> CloudResult<Vec<String>> {
        self.ask(Call::InstanceTypesForRequirements(
            requirements.clone(),
            image_id.map(str::to_string),
        ))
        .await
    }
    async fn termination_cause(&self, group: &str, id: &str) -> CloudResult<Option<String>> {
        self.ask(Call::TerminationCause(group.into(), id.into()))
            .await
    }
    async fn instance_addresses(&self, id: &str) -> CloudResult<InstanceAddresses> {
        self.ask(Call::InstanceAddresses(id.into())).await
    }
    async fn target_groups(&self) -> CloudResult<Vec<TargetGroup>> {
        self.ask(Call::TargetGroups).await
    }
    async fn target_health(&self, arn: &str) -> CloudResult<Vec<TargetHealth>> {
        self.ask(Call::TargetHealth(arn.into())).await
    }
    async fn deregistration_delay(&self, arn: &str) -> CloudResult<Option<String>> {
        self.ask(Call::DeregistrationDelay(arn.into())).await
    }
    async fn group_target_groups(&self, group: &str) -> CloudResult<Vec<String>> {
        self.ask(Call::GroupTargetGroups(group.into())).await
    }
    async fn deregister_targets(&self, arn: &str, targets: &[TargetHealth]) -> CloudResult<()> {
        self.ask(Call::DeregisterTargets(arn.into(), targets.to_vec()))
            .await
    }
}
