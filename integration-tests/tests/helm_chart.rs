//! The Helm chart (issue 5): `helm lint --strict` and `helm template` over every values file
//! in `helm/sluice/ci/`, and checks of what matters in the rendered manifests — each
//! service accepts the config and environment its pod gets, probes hit the real health
//! endpoints on declared ports, selectors select, secrets come by reference only, images
//! are the Dockerfile's targets.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `helm`: `$HELM`, the project's (`deploy/install.sh` puts it in `.work/tools/bin`), or PATH.
fn helm() -> PathBuf {
    let local = repo().join(".work/tools/bin/helm");
    let found = std::env::var_os("HELM")
        .map(PathBuf::from)
        .or_else(|| local.exists().then_some(local))
        .or_else(|| {
            Command::new("helm")
                .arg("version")
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|_| PathBuf::from("helm"))
        });
    found.unwrap_or_else(|| {
        panic!("helm is missing: run deploy/install.sh (make install), or set HELM")
    })
}

fn helm_run(args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm())
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run helm");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn render(values: &Path, extra: &[&str]) -> Result<Vec<Value>, String> {
    let values = values.to_str().unwrap();
    let mut args = vec!["template", "t", "helm/sluice", "-f", values];
    args.extend(extra);
    let text = helm_run(&args)?;
    Ok(serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).expect("rendered YAML"))
        .filter(|v| !v.is_null())
        .collect())
}

use serde::Deserialize as _;

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(v, |v, k| &v[*k])
}

fn str_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .map(|m| m.iter().map(|(k, v)| (str_of(k), str_of(v))).collect())
        .unwrap_or_default()
}

fn selects(selector: &BTreeMap<String, String>, pod: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| pod.get(k) == Some(v))
}

/// The Dockerfile's build targets (`FROM ... AS name`) with the ports each `EXPOSE`s,
/// checking it is multi-stage and that every final image runs as a non-root user.
fn dockerfile_targets() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let mut targets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut user: BTreeMap<String, String> = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["FROM", _, "AS", name] | ["FROM", _, "as", name] => {
                current = Some(name.to_string());
                targets.insert(name.to_string(), BTreeSet::new());
            }
            ["FROM", ..] => current = None,
            ["EXPOSE", ports @ ..] => {
                if let Some(c) = &current {
                    let exposed = targets.get_mut(c).expect("a target");
                    exposed.extend(ports.iter().map(|p| p.to_string()));
                }
            }
            ["USER", u] => {
                if let Some(c) = &current {
                    user.insert(c.clone(), u.to_string());
                }
            }
            _ => {}
        }
    }
    assert!(
        text.lines().filter(|l| l.starts_with("FROM ")).count() >= 2,
        "the Dockerfile is multi-stage"
    );
    for t in ["center", "worker", "etl"] {
        let u = user
            .get(t)
            .unwrap_or_else(|| panic!("Dockerfile target {t} sets no USER"));
        assert!(
            !u.starts_with("root") && !u.starts_with("0"),
            "target {t} runs as {u}"
        );
    }
    targets
}

/// Loads the config a pod gets (its ConfigMap's file and its environment, secrets
/// standing in) with the service's own loader and checks.
fn check_config(component: &str, toml: &str, env: Vec<(String, String)>) {
    let dir = std::env::temp_dir().join(format!("sluice-chart-{}-{component}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.toml");
    std::fs::write(&path, toml).unwrap();
    fn load<C: serde::de::DeserializeOwned>(
        path: &Path,
        env: Vec<(String, String)>,
        validate: fn(&C) -> Result<(), Vec<String>>,
    ) -> Result<(), String> {
        let c: C = sluice_runtime::load_config_from(Some(path), "SLUICE", env)
            .map_err(|e| e.to_string())?;
        validate(&c).map_err(|p| p.join("; "))
    }
    let problems = match component {
        "center" => load(&path, env, sluice_center::config::CenterConfig::validate),
        "worker" => load(&path, env, sluice_worker::config::WorkerConfig::validate),
        "etl" => load(&path, env, sluice_etl::EtlConfig::validate),
        other => panic!("unknown component {other}"),
    };
    if let Err(p) = problems {
        panic!("the {component} would not start with its rendered config: {p}\n{toml}");
    }
}

/// `key = "<n>s"` of a rendered TOML file, in seconds.
fn toml_seconds(toml: &str, key: &str) -> Option<u64> {
    toml.lines()
        .filter_map(|l| l.trim().strip_prefix(key)?.trim().strip_prefix('='))
        .find_map(|v| v.trim().trim_matches('"').strip_suffix('s')?.parse().ok())
}

/// The Secrets a values file names (every `secretName`, and `name` of every `*Secret`).
fn secrets_named(values: &serde_yaml::Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    fn walk(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Mapping(m) => {
                for (k, child) in m {
                    let k = str_of(k);
                    if k.ends_with("Secret") {
                        if let Some(n) = child.get("name").map(str_of).filter(|n| !n.is_empty()) {
                            out.insert(n);
                        }
                    }
                    if k == "secretName" || k == "tlsSecret" && !str_of(child).is_empty() {
                        out.insert(str_of(child));
                    }
                    walk(child, out);
                }
            }
            Value::Sequence(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    walk(values, &mut out);
    out
}

#[test]
fn the_chart_renders_what_a_cluster_needs_for_every_ci_values_file() {
    let targets = dockerfile_targets();
    let ci = repo().join("helm/sluice/ci");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&ci)
        .expect("helm/sluice/ci")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "values files in helm/sluice/ci: {files:?}"
    );
    let mut checked = 0;
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        helm_run(&[
            "lint",
            "--strict",
            "helm/sluice",
            "-f",
            file.to_str().unwrap(),
        ])
        .unwrap_or_else(|e| panic!("helm lint {name}:\n{e}"));
        let values: Value = serde_yaml::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let docs = render(file, &[]).unwrap_or_else(|e| panic!("helm template {name}:\n{e}"));
        let of = |kind: &'static str| docs.iter().filter(move |d| d["kind"] == kind);
        let config_maps: BTreeMap<String, String> = of("ConfigMap")
            .map(|d| {
                (
                    str_of(s(d, &["metadata", "name"])),
                    str_of(s(d, &["data", "config.toml"])),
                )
            })
            .collect();
        for (cm, toml) in &config_maps {
            for line in toml.lines().map(str::trim) {
                assert!(
                    !(line.starts_with("password")
                        || line.starts_with("token =")
                        || line.contains("sasl.password")),
                    "{name}: ConfigMap {cm} holds a secret: `{line}`"
                );
            }
        }
        // The Secrets the values name, and those the chart makes itself (the workers'
        // token when the values name none).
        let mut wanted_secrets = secrets_named(&values);
        wanted_secrets.extend(of("Secret").map(|d| str_of(s(d, &["metadata", "name"]))));
        let mut referenced = BTreeSet::new();
        let mut workloads: Vec<(String, BTreeMap<String, String>, BTreeSet<String>)> = Vec::new();
        for w in of("Deployment").chain(of("StatefulSet")) {
            let wname = str_of(s(w, &["metadata", "name"]));
            let pod = s(w, &["spec", "template"]);
            let pod_labels = labels(s(pod, &["metadata", "labels"]));
            let component = pod_labels["app.kubernetes.io/component"].clone();
            assert!(
                selects(
                    &labels(s(w, &["spec", "selector", "matchLabels"])),
                    &pod_labels
                ),
                "{name}: {wname}'s selector does not select its pods"
            );
            assert!(
                s(pod, &["metadata", "annotations", "checksum/config"]).is_string(),
                "{name}: {wname} has no config checksum annotation"
            );
            let psc = s(pod, &["spec", "securityContext"]);
            assert_eq!(
                psc["runAsNonRoot"],
                Value::Bool(true),
                "{name}: {wname} runAsNonRoot"
            );
            assert!(
                psc["runAsUser"].as_u64().is_some_and(|u| u > 0),
                "{name}: {wname} runAsUser"
            );
            let containers = s(pod, &["spec", "containers"])
                .as_sequence()
                .expect("containers");
            assert_eq!(containers.len(), 1, "{name}: {wname}");
            let c = &containers[0];
            let ports: BTreeSet<String> = c["ports"]
                .as_sequence()
                .into_iter()
                .flatten()
                .flat_map(|p| [str_of(&p["name"]), str_of(&p["containerPort"])])
                .collect();
            for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
                let get = s(c, &[probe, "httpGet"]);
                assert_eq!(str_of(&get["path"]), path, "{name}: {wname} {probe}");
                assert!(
                    ports.contains(&str_of(&get["port"])),
                    "{name}: {wname} {probe} port {:?} is not declared",
                    get["port"]
                );
            }
            assert!(
                s(c, &["resources", "requests"])
                    .as_mapping()
                    .is_some_and(|m| !m.is_empty()),
                "{name}: {wname} has no resource requests"
            );
            assert_eq!(
                s(c, &["securityContext", "allowPrivilegeEscalation"]),
                &Value::Bool(false),
                "{name}: {wname}"
            );
            let image = str_of(&c["image"]);
            let repo_name = image.rsplit('/').next().unwrap().split(':').next().unwrap();
            let target = repo_name.trim_start_matches("sluice-");
            let exposed = targets.get(target).unwrap_or_else(|| {
                panic!("{name}: image {image} is no Dockerfile target ({targets:?})")
            });
            for port in c["ports"].as_sequence().into_iter().flatten() {
                let port = str_of(&port["containerPort"]);
                assert!(
                    exposed.contains(&port),
                    "{name}: {wname} listens on {port}, which the Dockerfile's {target} does not EXPOSE ({exposed:?})"
                );
            }
            if component == "center" {
                assert!(
                    s(w, &["spec", "replicas"]).as_u64().is_some_and(|r| r >= 2),
                    "{name}: fewer than 2 centers"
                );
            }
            // The environment the service gets, secrets standing in.
            let mut env = Vec::new();
            for e in c["env"].as_sequence().into_iter().flatten() {
                let key = str_of(&e["name"]);
                let from = &e["valueFrom"];
                let value = if let Some(secret) = from.get("secretKeyRef") {
                    let secret_name = str_of(&secret["name"]);
                    assert!(
                        wanted_secrets.contains(&secret_name),
                        "{name}: {wname} reads Secret {secret_name}, which the values do not name"
                    );
                    assert!(
                        !str_of(&secret["key"]).is_empty(),
                        "{name}: {wname}: a secretKeyRef without a key"
                    );
                    referenced.insert(secret_name.clone());
                    if key == "SLUICE_ZOOKEEPER__AUTH" {
                        // A digest credential is `user:password`.
                        format!("sluice:from-secret-{secret_name}")
                    } else {
                        format!("from-secret-{secret_name}")
                    }
                } else if let Some(field) = from.get("fieldRef") {
                    let f = str_of(&field["fieldPath"]);
                    if key == "SLUICE_ETL__INSTANCE_ID" {
                        assert_eq!(
                            f, "metadata.name",
                            "{name}: the etl's instance id is its pod name"
                        );
                    }
                    if f == "status.podIP" {
                        "10.0.0.7".to_owned()
                    } else {
                        format!("{wname}-0")
                    }
                } else {
                    str_of(&e["value"]).replace("$(POD_IP)", "10.0.0.7")
                };
                env.push((key, value));
            }
            if component == "etl" {
                assert!(
                    env.iter().any(|(k, _)| k == "SLUICE_ETL__INSTANCE_ID"),
                    "{name}: the etl has no instance id"
                );
            }
            // Every service presents ZooKeeper's credential when the values name one.
            let zk_secret = str_of(s(&values, &["zookeeper", "authSecret", "name"]));
            if !zk_secret.is_empty() {
                let auth = env.iter().find(|(k, _)| k == "SLUICE_ZOOKEEPER__AUTH");
                assert_eq!(
                    auth.map(|(_, v)| v.as_str()),
                    Some(format!("sluice:from-secret-{zk_secret}").as_str()),
                    "{name}: {wname}'s ZooKeeper credential"
                );
            }
            // TLS to MySQL: every service trusts the mounted CA for the sources, the
            // centers for the meta database too.
            if !str_of(s(&values, &["mysql", "tlsSecret"])).is_empty() {
                let mut keys = vec!["SLUICE_SOURCE_TLS__CA"];
                if component == "center" {
                    keys.push("SLUICE_META__TLS__CA");
                }
                for key in keys {
                    let ca = env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
                    assert_eq!(
                        ca,
                        Some("/etc/sluice/mysql-tls/ca.pem"),
                        "{name}: {wname}: {key}"
                    );
                }
            }
            // TLS to Elasticsearch: every component trusts its CA and presents the client
            // certificate (the etl writes, the centers move aliases, the workers compare
            // the index with MySQL in consistency checks).
            let es_secret = str_of(s(&values, &["elasticsearch", "tlsSecret"]));
            if !es_secret.is_empty() {
                let env_of =
                    |key: &str| env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
                let client =
                    s(&values, &["elasticsearch", "clientCertificate"]).as_bool() == Some(true);
                for (key, file, wanted) in [
                    ("SLUICE_ELASTICSEARCH__TLS__CA", "ca.pem", true),
                    ("SLUICE_ELASTICSEARCH__TLS__KEY", "client.key", client),
                ] {
                    let path = format!("/etc/sluice/es-tls/{file}");
                    assert_eq!(
                        env_of(key),
                        wanted.then_some(path.as_str()),
                        "{name}: {wname}: {key}"
                    );
                }
                let mounts = s(pod, &["spec", "volumes"])
                    .as_sequence()
                    .into_iter()
                    .flatten();
                let mounted = mounts
                    .filter_map(|v| v.get("secret"))
                    .any(|secret| str_of(&secret["secretName"]) == es_secret);
                assert!(mounted, "{name}: {wname} mounts {es_secret}");
            }
            // Workers get their own report-only token (the values' or one the chart
            // makes), never the admin token, and the centers accept exactly that one.
            if str_of(s(&values, &["api", "auth"])) != "mtls" {
                let named = str_of(s(&values, &["api", "workerTokenSecret", "name"]));
                let worker_secret = if named.is_empty() {
                    let made: Vec<String> = of("Secret")
                        .map(|d| str_of(s(d, &["metadata", "name"])))
                        .filter(|n| n.ends_with("-worker-token"))
                        .collect();
                    assert_eq!(made.len(), 1, "{name}: the chart makes the workers' token");
                    made[0].clone()
                } else {
                    named
                };
                let admin = str_of(s(&values, &["api", "tokenSecret", "name"]));
                assert_ne!(worker_secret, admin, "{name}: workers hold the admin token");
                let wanted = format!("from-secret-{worker_secret}");
                let key = match component.as_str() {
                    "worker" => Some("SLUICE_CENTER__TOKEN"),
                    "center" => Some("SLUICE_API__WORKER_TOKEN"),
                    _ => None,
                };
                if let Some(key) = key {
                    let token = env.iter().find(|(k, _)| k == key);
                    assert_eq!(
                        token.map(|(_, v)| v.as_str()),
                        Some(wanted.as_str()),
                        "{name}: {wname}'s {key}"
                    );
                }
            }
            for v in s(pod, &["spec", "volumes"])
                .as_sequence()
                .into_iter()
                .flatten()
            {
                if let Some(secret) = v.get("secret") {
                    let secret_name = str_of(&secret["secretName"]);
                    assert!(
                        wanted_secrets.contains(&secret_name),
                        "{name}: {wname} mounts Secret {secret_name}, which the values do not name"
                    );
                    referenced.insert(secret_name);
                }
            }
            let cm = s(pod, &["spec", "volumes"])
                .as_sequence()
                .into_iter()
                .flatten()
                .find_map(|v| v.get("configMap").map(|c| str_of(&c["name"])))
                .unwrap_or_else(|| panic!("{name}: {wname} mounts no ConfigMap"));
            // Room to drain: the worker's drain bound, the etl's last bulk.
            let bound = match component.as_str() {
                "worker" => toml_seconds(&config_maps[&cm], "drain_timeout"),
                "etl" => toml_seconds(&config_maps[&cm], "request_timeout"),
                _ => None,
            };
            if let Some(bound) = bound {
                let grace = s(pod, &["spec", "terminationGracePeriodSeconds"])
                    .as_u64()
                    .unwrap_or(30);
                assert!(
                    grace >= bound + 10,
                    "{name}: {wname} gets {grace} s to stop, its drain may take {bound} s"
                );
            }
            check_config(&component, &config_maps[&cm], env);
            workloads.push((component, pod_labels, ports));
        }
        assert_eq!(workloads.len(), 3, "{name}: center, worker and etl");
        assert_eq!(
            referenced, wanted_secrets,
            "{name}: Secrets named in the values but never read"
        );
        for svc in of("Service") {
            let sname = str_of(s(svc, &["metadata", "name"]));
            let sel = labels(s(svc, &["spec", "selector"]));
            let matched: Vec<_> = workloads
                .iter()
                .filter(|(_, l, _)| selects(&sel, l))
                .collect();
            assert_eq!(
                matched.len(),
                1,
                "{name}: Service {sname} selects {} workloads",
                matched.len()
            );
            for p in s(svc, &["spec", "ports"]).as_sequence().expect("ports") {
                assert!(
                    matched[0].2.contains(&str_of(&p["targetPort"])),
                    "{name}: Service {sname} targets undeclared port {:?}",
                    p["targetPort"]
                );
            }
        }
        for pdb in of("PodDisruptionBudget") {
            let sel = labels(s(pdb, &["spec", "selector", "matchLabels"]));
            assert_eq!(
                workloads
                    .iter()
                    .filter(|(_, l, _)| selects(&sel, l))
                    .count(),
                1,
                "{name}: PDB {:?} selects no single workload",
                pdb["metadata"]["name"]
            );
        }
        assert_eq!(
            of("PodDisruptionBudget").count(),
            3,
            "{name}: a PDB per component"
        );
        let monitors: Vec<_> = of("ServiceMonitor").collect();
        let enabled = values["serviceMonitor"]["enabled"] == Value::Bool(true);
        assert_eq!(
            monitors.len(),
            usize::from(enabled),
            "{name}: ServiceMonitor iff serviceMonitor.enabled"
        );
        if let Some(m) = monitors.first() {
            let sel = labels(s(m, &["spec", "selector", "matchLabels"]));
            let metrics_services = of("Service")
                .filter(|svc| selects(&sel, &labels(s(svc, &["metadata", "labels"]))))
                .filter(|svc| {
                    svc["spec"]["ports"]
                        .as_sequence()
                        .into_iter()
                        .flatten()
                        .any(|p| p["name"] == "metrics")
                })
                .count();
            assert_eq!(
                metrics_services, 3,
                "{name}: the ServiceMonitor reaches every component's metrics port"
            );
        }
        checked += docs.len();
    }

    // What must not render.
    let small = ci.join("small-values.yaml");
    let e = render(&small, &["--set", "center.replicas=1"]).unwrap_err();
    assert!(e.contains("center.replicas must be at least 2"), "{e}");
    let e = render(&small, &["--set", "sourcePasswords[0].env=SLUICE_DB,sourcePasswords[0].secretName=s,sourcePasswords[0].secretKey=k"]).unwrap_err();
    assert!(e.contains("starts with SLUICE_"), "{e}");
    let e = render(&small, &["--set", "meta.passwordSecret.name="]).unwrap_err();
    assert!(e.contains("meta.passwordSecret.name is required"), "{e}");
    println!("{} values files, {checked} manifests checked", files.len());
}

/// The chart sets `RUST_LOG` from `log.level`, which overrides the services' own default:
/// the two must say the same, or a cluster logs what a local run filters out.
#[test]
fn the_charts_default_log_filter_is_the_services_own() {
    let text = std::fs::read_to_string(repo().join("helm/sluice/values.yaml")).unwrap();
    let values: Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(
        str_of(s(&values, &["log", "level"])),
        sluice_runtime::telemetry::DEFAULT_FILTER
    );
}
