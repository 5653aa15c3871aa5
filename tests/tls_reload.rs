//! mTLS that follows the files on disk: rotate the server certificate (to a new CA)
//! and the client CA under a running server, and connect with a real tonic client
//! after each step.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};

use ca_asg_provider::config::TlsFile;
use ca_asg_provider::grpc::ReloadingTls;
use ca_asg_provider::proto;
use ca_asg_provider::proto::cloud_provider_client::CloudProviderClient;
use ca_asg_provider::provider::Provider;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

mod support;

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Self {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf certificate and its key (PEM), for a server (`localhost`) or a client.
    fn leaf(&self, server: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.distinguished_name.push(
            DnType::CommonName,
            if server {
                "ca-asg-provider"
            } else {
                "cluster-autoscaler"
            },
        );
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Writes a file the way a Secret volume updates: a new file renamed into place.
fn put(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn call(
    addr: std::net::SocketAddr,
    trust: &str,
    client: &(String, String),
) -> Result<usize, String> {
    let tls = ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(Certificate::from_pem(trust))
        .identity(Identity::from_pem(&client.0, &client.1));
    let channel: Channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut ca = CloudProviderClient::new(channel);
    ca.node_groups(proto::NodeGroupsRequest {})
        .await
        .map(|r| r.into_inner().node_groups.len())
        .map_err(|e| format!("call: {e:?}"))
}

fn reloads(outcome: &str) -> u64 {
    ca_asg_provider::telemetry::metrics::metrics()
        .encode()
        .lines()
        .find(|l| {
            l.starts_with("ca_asg_provider_tls_reloads_total")
                && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// A provider over one in-memory group, "web", found by its tag.
async fn provider() -> Arc<Provider> {
    let cloud = MemoryCloud::new(
        vec![MemoryGroup::new("web", 0, 3, 1, "m5.large")
            .tag("k8s.io/cluster-autoscaler/enabled", "true")],
        MemoryTiming::default(),
    );
    let provider = ca_asg_provider::world::provider(
        Arc::new(cloud),
        ca_asg_provider::world::tagged(&["k8s.io/cluster-autoscaler/enabled"]),
    )
    .await
    .unwrap();
    provider
}

#[tokio::test]
async fn rotated_certificates_and_client_ca_apply_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFile {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
        client_ca: dir.path().join("ca.crt"),
    };
    let server_ca = Ca::new("server CA 1");
    let client_ca = Ca::new("client CA 1");
    let (cert, key) = server_ca.leaf(true);
    put(&files.cert, &cert);
    put(&files.key, &key);
    put(&files.client_ca, &client_ca.pem());
    let client = client_ca.leaf(false);

    let provider = provider().await;
    let tls = Arc::new(ReloadingTls::with_recheck(&files, Duration::ZERO).unwrap());
    let (listener, addr) = ca_asg_provider::grpc::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    tokio::spawn(ca_asg_provider::grpc::serve(
        listener,
        provider,
        Some(tls),
        std::future::pending(),
    ));

    assert_eq!(call(addr, &server_ca.pem(), &client).await, Ok(1));
    // A client without a certificate of the client CA is refused.
    let stranger = Ca::new("stranger").leaf(false);
    assert!(call(addr, &server_ca.pem(), &stranger).await.is_err());

    // cert-manager renews the server certificate, here under a new CA.
    let ok_before = reloads("ok");
    let server_ca2 = Ca::new("server CA 2");
    let (cert2, key2) = server_ca2.leaf(true);
    put(&files.key, &key2);
    put(&files.cert, &cert2);
    assert_eq!(
        call(addr, &server_ca2.pem(), &client).await,
        Ok(1),
        "the renewed certificate is served"
    );
    assert!(
        call(addr, &server_ca.pem(), &client).await.is_err(),
        "the old certificate is no longer served"
    );
    assert!(reloads("ok") > ok_before);

    // The client CA rotates: CA's renewed client certificate is taken, the old refused.
    let client_ca2 = Ca::new("client CA 2");
    put(&files.client_ca, &client_ca2.pem());
    let client2 = client_ca2.leaf(false);
    assert_eq!(call(addr, &server_ca2.pem(), &client2).await, Ok(1));
    assert!(call(addr, &server_ca2.pem(), &client).await.is_err());

    // A rotation caught halfway (a key that does not match, or garbage) keeps serving
    // the last good set, and is counted.
    let errors_before = reloads("error");
    put(
        &files.cert,
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
    );
    assert_eq!(
        call(addr, &server_ca2.pem(), &client2).await,
        Ok(1),
        "still the last good certificate"
    );
    assert!(reloads("error") > errors_before);
    // Once the set is whole again, it loads.
    let (cert3, key3) = server_ca2.leaf(true);
    put(&files.key, &key3);
    put(&files.cert, &cert3);
    assert_eq!(call(addr, &server_ca2.pem(), &client2).await, Ok(1));
}

#[test]
fn a_bad_set_at_start_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFile {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
        client_ca: dir.path().join("ca.crt"),
    };
    let e = ReloadingTls::load(&files).err().unwrap().to_string();
    assert!(e.contains("tls.cert") && e.contains("tls.crt"), "{e}");
    let ca = Ca::new("c");
    let (cert, key) = ca.leaf(true);
    put(&files.cert, &cert);
    put(&files.key, &key);
    put(&files.client_ca, "no pem here");
    let e = ReloadingTls::load(&files).err().unwrap().to_string();
    assert!(e.contains("tls.clientCA"), "{e}");
}

/// Issue 59: a client on gRPC's C core (grpcio) is answered over mTLS, the transport
/// of standalone mode (the chart's and the overlay's `listen: 0.0.0.0:8086` with `tls`),
/// as grpc-go (CA) and tonic are.
#[tokio::test]
async fn a_client_on_grpcs_c_core_is_answered_over_mtls_as_in_standalone_mode() {
    let Some(python) = support::grpcio::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFile {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
        client_ca: dir.path().join("ca.crt"),
    };
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let (cert, key) = server_ca.leaf(true);
    put(&files.cert, &cert);
    put(&files.key, &key);
    put(&files.client_ca, &client_ca.pem());
    let (client_cert, client_key) = client_ca.leaf(false);
    let trust = dir.path().join("client-trusts.crt");
    let (ccert, ckey) = (dir.path().join("client.crt"), dir.path().join("client.key"));
    put(&trust, &server_ca.pem());
    put(&ccert, &client_cert);
    put(&ckey, &client_key);
    let tls = Arc::new(ReloadingTls::load(&files).unwrap());
    let (listener, addr) = ca_asg_provider::grpc::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    tokio::spawn(ca_asg_provider::grpc::serve(
        listener,
        provider().await,
        Some(tls),
        std::future::pending(),
    ));
    let target = format!("localhost:{}", addr.port());
    let (groups, label) =
        support::grpcio::ask(&python, &target, Some([&trust, &ckey, &ccert])).await;
    assert_eq!(groups, vec![vec!["web".to_string()]; 3]);
    assert_eq!(label, "k8s.amazonaws.com/accelerator");
}
