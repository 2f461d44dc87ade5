//! The Kubernetes mission backend against the fake API server: the mission conformance suite,
//! then the Job it writes, the answers it gets, and what it does with each.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{TimeZone, Utc};
use cm_dispatch::conformance::{DEADLINE_SLACK, EffectProbe};
use cm_dispatch::fakes::kubernetes::{CreateFault, FakeKubernetes, StoredJob};
use cm_dispatch::kubernetes::{KEY_ANNOTATION, is_dns_label};
use cm_dispatch::mission::MissionConfig;
use cm_dispatch::mission_conformance::{LaunchFaults, check_mission_backend, payload_of_task};
use cm_dispatch::{
    Dispatch, DispatchError, Dispatcher, KubernetesDispatcher, MAX_RUN_OUTPUT, MissionRuntime,
    RunRef, RunReport,
};
use cm_domain::{IdempotencyKey, Occurrence};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::missions::{floods_cut, mission, mission_dispatch};

const IMAGE: &str = "registry.example.com/cm/mission-runner:1.4";
const TOKEN: &str = "kube-token-4f1d8c0b9a7e";

/// A kubeconfig file for a fake, removed when dropped.
struct Kubeconfig(PathBuf);

impl Kubeconfig {
    fn write(text: &str) -> Kubeconfig {
        let path = std::env::temp_dir().join(format!("cm_kubeconfig_{}", Uuid::new_v4().simple()));
        std::fs::write(&path, text).unwrap();
        Kubeconfig(path)
    }
}

impl Drop for Kubeconfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn backend(fake: &FakeKubernetes, config: MissionConfig) -> KubernetesDispatcher {
    // The context's namespace is not the operator's: the configuration's wins.
    let file = Kubeconfig::write(&fake.kubeconfig("elsewhere"));
    KubernetesDispatcher::from_kubeconfig(&file.0, IMAGE.to_owned(), config)
        .await
        .unwrap()
}

/// A mission dispatch due within `within`.
fn dispatch(payload: Value, attempt: u32, within: Duration) -> Dispatch {
    Dispatch {
        deadline: Instant::now() + within,
        ..mission_dispatch(payload, attempt)
    }
}

/// `METHOD path status` of every call, the Job's name written as NAME.
fn calls(fake: &FakeKubernetes, name: &str) -> Vec<String> {
    fake.calls()
        .into_iter()
        .map(|c| format!("{} {} {}", c.method, c.path.replace(name, "NAME"), c.status))
        .collect()
}

/// Counts the Jobs launched for a key by the `CM_IDEMPOTENCY_KEY` their container carries,
/// whatever they are named, so a backend that named a second Job differently is caught.
struct KubeProbe(Arc<FakeKubernetes>);

impl KubeProbe {
    fn of(&self, key: &IdempotencyKey) -> Vec<StoredJob> {
        self.0
            .jobs()
            .into_iter()
            .filter(|j| j.env_var("CM_IDEMPOTENCY_KEY") == Some(key.as_str()))
            .collect()
    }
}

#[async_trait]
impl EffectProbe for KubeProbe {
    async fn effects(&self, key: &IdempotencyKey) -> Result<usize, String> {
        Ok(self.of(key).len())
    }
    async fn payload(&self, key: &IdempotencyKey) -> Result<Option<Value>, String> {
        Ok(self
            .of(key)
            .first()
            .and_then(|j| j.env_var("CM_TASK").and_then(payload_of_task)))
    }
    /// The next create never answers, and stores nothing.
    async fn stall(&self) -> Result<(), String> {
        self.0.fault_next_create(CreateFault::StallBeforeCreate);
        Ok(())
    }
    /// The next create is forbidden with `reason` (a quota, an admission webhook).
    async fn fail(&self, reason: &str) -> Result<(), String> {
        self.0.fault_next_create(CreateFault::Refuse {
            code: 403,
            message: reason.to_owned(),
        });
        Ok(())
    }
    async fn heal(&self) -> Result<(), String> {
        self.0.clear_faults();
        Ok(())
    }
    fn secret(&self) -> Option<String> {
        Some(TOKEN.to_owned())
    }
}

impl LaunchFaults for KubeProbe {
    /// A Job create has no second step: the crash is after the Job was stored, before the
    /// answer came back.
    fn crash_after_create(&self) {
        self.0.fault_next_create(CreateFault::StallAfterCreate);
    }
    fn launched_by_create(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn kubernetes_backend_conforms() {
    let fake = Arc::new(FakeKubernetes::start(&["default"], TOKEN));
    let kube = backend(&fake, MissionConfig::default()).await;
    let probe = KubeProbe(fake.clone());
    check_mission_backend(&kube, &probe, Some(&probe))
        .await
        .unwrap();
    let jobs = fake.jobs();
    assert!(jobs.len() >= 4, "{jobs:?}");
    // Every Job is named by its occurrence's key, in the configured namespace.
    for job in &jobs {
        assert_eq!(job.namespace, "default");
        assert_eq!(job.env_var("CM_IDEMPOTENCY_KEY"), Some(job.name.as_str()));
    }
    // The fake refused every second create of a name; nothing else was refused.
    let creates: Vec<u16> = fake
        .calls()
        .into_iter()
        .filter(|c| c.method == "POST")
        .map(|c| c.status)
        .collect();
    assert_eq!(
        creates.iter().filter(|s| **s == 201).count() + 1,
        jobs.len(),
        "one create was stored without an answer: {creates:?}"
    );
    assert!(
        creates.iter().all(|s| [0, 201, 403, 409].contains(s)),
        "{creates:?}"
    );
}

/// A time as the API server writes it.
fn at(text: &str) -> Option<chrono::DateTime<Utc>> {
    Some(text.parse().unwrap())
}

#[tokio::test]
async fn kubernetes_reports_the_newest_pods_log_tail_and_the_jobs_times() {
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let kube = backend(&fake, MissionConfig::default()).await;
    let launched = dispatch(mission(), 1, Duration::from_secs(10));
    kube.dispatch(&launched).await.unwrap();
    let job = launched.idempotency_key.to_string();
    let run = RunRef::named(job.clone());
    let deadline = || Instant::now() + Duration::from_secs(5);

    // Created, no pod yet, no status: nothing to say.
    assert_eq!(
        kube.report(&run, deadline()).await.unwrap(),
        RunReport::default()
    );

    // The first try's pod failed; the second try's log is the run's. Its lines are 200 bytes,
    // so a tail of 500 does not fit a read and a tail of 100 does.
    fake.add_pod("default", &job, "first try\n");
    let mut log: String = (0..3000)
        .map(|i| format!("{i:05} {}\n", "x".repeat(193)))
        .collect();
    log.push_str("login with password=hunter2\nlast\n");
    let second = fake.add_pod("default", &job, &log);
    // A pod of another Job is not this run's.
    fake.add_pod("default", "cm-other-job", "not mine\n");
    assert!(fake.set_job_status(
        "default",
        &job,
        json!({ "startTime": "2026-03-29T01:00:01Z", "completionTime": "2026-03-29T01:00:09Z",
                "succeeded": 1, "conditions": [{ "type": "Complete", "status": "True",
                "lastTransitionTime": "2026-03-29T01:00:09Z" }] }),
    ));
    let before = fake.calls().len();
    let report = kube.report(&run, deadline()).await.unwrap();
    assert_eq!(report.started_at, at("2026-03-29T01:00:01Z"));
    assert_eq!(report.finished_at, at("2026-03-29T01:00:09Z"));
    let output = report.output.unwrap();
    assert!(output.len() <= MAX_RUN_OUTPUT, "{}", output.len());
    assert!(output.len() > MAX_RUN_OUTPUT - 200, "{}", output.len());
    assert!(output.starts_with("0"), "{}", &output[..20]);
    assert!(
        output.ends_with("login with password=***\nlast\n"),
        "{}",
        &output[output.len() - 60..]
    );
    let reads: Vec<String> = fake.calls()[before..]
        .iter()
        .map(|c| {
            format!(
                "{} {} {} {}",
                c.method,
                c.path.replace(&job, "JOB"),
                c.query.replace(&job, "JOB"),
                c.status
            )
        })
        .collect();
    let pod = second.replace(&job, "JOB");
    assert_eq!(
        reads,
        [
            "GET /apis/batch/v1/namespaces/default/jobs/JOB  200".to_owned(),
            "GET /api/v1/namespaces/default/pods labelSelector=batch.kubernetes.io/job-name=JOB 200"
                .to_owned(),
            format!(
                "GET /api/v1/namespaces/default/pods/{pod}/log \
                 container=mission&limitBytes=65536&tailLines=500 200"
            ),
            format!(
                "GET /api/v1/namespaces/default/pods/{pod}/log \
                 container=mission&limitBytes=65536&tailLines=100 200"
            ),
        ]
    );

    // A failed Job ended when its Failed condition says.
    assert!(fake.set_job_status(
        "default",
        &job,
        json!({ "startTime": "2026-03-29T01:00:01Z", "failed": 1, "conditions": [
            { "type": "FailureTarget", "status": "True", "lastTransitionTime": "2026-03-29T01:00:05Z" },
            { "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
              "lastTransitionTime": "2026-03-29T01:00:07Z" }] }),
    ));
    let report = kube.report(&run, deadline()).await.unwrap();
    assert_eq!(report.finished_at, at("2026-03-29T01:00:07Z"));

    // Without the right to read logs, the report fails with the server's words.
    fake.grant_only(Some(&[
        "create jobs",
        "get jobs",
        "delete jobs",
        "list pods",
    ]));
    let err = kube.report(&run, deadline()).await.unwrap_err();
    assert!(err.to_string().contains("forbidden"), "{err}");
    fake.grant_only(None);

    // Deleted with its pods (its TTL, an operator): nothing left, and no error.
    kube.stop(&run, deadline()).await.unwrap();
    assert_eq!(
        kube.report(&run, deadline()).await.unwrap(),
        RunReport::default()
    );
}

/// A stop (overlap `replace`) deletes the Job in the foreground and returns only once the Job
/// and its pods are gone: while the pod's containers take their grace to end, the Job lingers
/// with a `deletionTimestamp`, and the stop waits. One whose pods outlast its deadline is not
/// confirmed, and the Job is left being deleted.
#[tokio::test]
async fn kubernetes_stop_returns_once_the_job_and_its_pods_are_gone() {
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let kube = backend(&fake, MissionConfig::default()).await;
    let launched = dispatch(mission(), 1, Duration::from_secs(10));
    kube.dispatch(&launched).await.unwrap();
    let job = launched.idempotency_key.to_string();
    fake.add_pod("default", &job, "working\n");
    fake.set_pod_termination(Duration::from_millis(1500));
    let run = RunRef::named(job.clone());
    let began = Instant::now();
    kube.stop(&run, Instant::now() + Duration::from_secs(10))
        .await
        .expect("stopped");
    assert_eq!(
        fake.pods_of("default", &job),
        Vec::<String>::new(),
        "a pod outlived the stop"
    );
    assert_eq!(fake.job("default", &job), None, "the Job outlived the stop");
    assert!(
        began.elapsed() >= Duration::from_millis(1500),
        "the stop did not wait for the pod: {:?}",
        began.elapsed()
    );
    // The Job was read back while it waited for its pod, until the server had no Job.
    let calls = calls(&fake, &job);
    let deleted = calls
        .iter()
        .position(|c| c.starts_with("DELETE "))
        .expect("a delete");
    let reads: Vec<&String> = calls[deleted + 1..]
        .iter()
        .filter(|c| c.starts_with("GET ") && c.contains("/jobs/NAME"))
        .collect();
    assert!(reads.len() >= 2, "{calls:?}");
    assert!(reads.last().unwrap().ends_with(" 404"), "{calls:?}");

    // A pod that takes longer than the stop may wait: not confirmed, the Job still there.
    let second = dispatch(mission(), 1, Duration::from_secs(10));
    kube.dispatch(&second).await.unwrap();
    let job = second.idempotency_key.to_string();
    fake.add_pod("default", &job, "working\n");
    fake.set_pod_termination(Duration::from_secs(60));
    let refused = kube
        .stop(
            &RunRef::named(job.clone()),
            Instant::now() + Duration::from_millis(800),
        )
        .await;
    assert!(
        matches!(&refused, Err(DispatchError::Unconfirmed(e)) if e.contains("still being deleted")),
        "{refused:?}"
    );
    let lingering = fake
        .job("default", &job)
        .expect("the Job is still being deleted");
    assert!(
        !lingering.object["metadata"]["deletionTimestamp"].is_null(),
        "{:?}",
        lingering.object
    );
    assert_eq!(fake.pods_of("default", &job).len(), 1);
}

#[tokio::test]
async fn kubernetes_jobs_are_the_operators_and_carry_the_missions_environment() {
    let fake = FakeKubernetes::start(&["missions"], TOKEN);
    let config = MissionConfig::from_json(
        r#"{"command": ["--verbose", "run"], "user": "1000:2000",
            "kubernetes": {"namespace": "missions", "service_account": "cm-missions",
                           "backoff_limit": 2, "active_deadline_seconds": 600,
                           "ttl_seconds_after_finished": 3600, "cpu": "500m", "memory": "1Gi"}}"#,
    )
    .unwrap();
    let kube = backend(&fake, config).await;
    let d = dispatch(mission(), 1, Duration::from_secs(10));
    let receipt = kube.dispatch(&d).await.unwrap();
    let name = d.idempotency_key.to_string();
    let job = fake.job("missions", &name).expect("a Job named by the key");
    assert_eq!(
        receipt.detail,
        format!("job missions/{name} uid {}", job.uid)
    );
    assert!(!receipt.duplicate);
    assert_eq!(
        calls(&fake, &name),
        ["POST /apis/batch/v1/namespaces/missions/jobs 201"]
    );
    assert_eq!(fake.calls()[0].query, "fieldManager=cm-scheduler");

    let spec = &job.object["spec"];
    assert_eq!(spec["backoffLimit"], 2);
    assert_eq!(spec["activeDeadlineSeconds"], 600);
    assert_eq!(spec["ttlSecondsAfterFinished"], 3600);
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["serviceAccountName"], "cm-missions");
    let c = job.container();
    assert_eq!(c["name"], "mission");
    assert_eq!(c["image"], IMAGE);
    assert_eq!(c["args"], json!(["--verbose", "run"]));
    assert!(c["command"].is_null(), "the image's entrypoint runs");
    assert_eq!(c["securityContext"]["runAsUser"], 1000);
    assert_eq!(c["securityContext"]["runAsGroup"], 2000);
    for side in ["requests", "limits"] {
        assert_eq!(
            c["resources"][side],
            json!({"cpu": "500m", "memory": "1Gi"})
        );
    }
    assert_eq!(job.env_var("CM_TASK"), Some("report"));
    assert_eq!(job.env_var("CM_REF"), Some("main"));
    assert_eq!(job.env_var("CM_ATTEMPT"), Some("1"));
    assert_eq!(job.env_var("LANG"), Some("C.UTF-8"));
    assert_eq!(job.env_var("CM_SCHEDULED_AT"), Some("2026-03-29T01:00:00Z"));
    assert_eq!(job.env_var("CM_IDEMPOTENCY_KEY"), Some(name.as_str()));
    let traceparent = d.traceparent().to_string();
    assert_eq!(job.env_var("CM_TRACEPARENT"), Some(traceparent.as_str()));
    assert_eq!(c["env"].as_array().map(Vec::len), Some(10));

    let routine_id = d.occurrence.routine_id.to_string();
    for meta in [&job.object["metadata"], &spec["template"]["metadata"]] {
        assert_eq!(meta["labels"]["cm.routine-id"], routine_id.as_str());
        assert_eq!(meta["labels"]["cm.attempt"], "1");
        assert_eq!(meta["labels"]["routine/team"], "platform");
        // A label value cannot hold ':': the instant is an annotation only.
        assert!(meta["labels"]["cm.scheduled-at"].is_null(), "{meta}");
        assert_eq!(
            meta["annotations"]["cm.scheduled-at"],
            "2026-03-29T01:00:00Z"
        );
        assert_eq!(meta["annotations"]["cm.routine-id"], routine_id.as_str());
        assert_eq!(meta["annotations"]["routine/team"], "platform");
        assert_eq!(meta["labels"]["cm.traceparent"], traceparent.as_str());
        assert_eq!(meta["annotations"]["cm.traceparent"], traceparent.as_str());
    }
    assert_eq!(
        job.object["metadata"]["annotations"][KEY_ANNOTATION],
        name.as_str()
    );
}

#[tokio::test]
async fn kubernetes_already_exists_is_already_launched_with_the_jobs_uid() {
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let kube = backend(&fake, MissionConfig::default()).await;
    let first = dispatch(mission(), 1, Duration::from_secs(10));
    let launched = kube.dispatch(&first).await.unwrap();
    let mut retry = first.clone();
    retry.attempt = 2;
    let again = kube.dispatch(&retry).await.unwrap();
    assert!(!launched.duplicate && again.duplicate);
    assert_eq!(again.detail, launched.detail);
    let name = first.idempotency_key.to_string();
    assert_eq!(
        calls(&fake, &name),
        [
            "POST /apis/batch/v1/namespaces/default/jobs 201",
            "POST /apis/batch/v1/namespaces/default/jobs 409",
            "GET /apis/batch/v1/namespaces/default/jobs/NAME 200",
        ]
    );
    assert_eq!(fake.jobs().len(), 1);
    // The Job keeps the first attempt's environment.
    assert_eq!(fake.jobs()[0].env_var("CM_ATTEMPT"), Some("1"));
}

#[tokio::test]
async fn kubernetes_server_errors_are_tried_again_within_the_deadline() {
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let kube = backend(&fake, MissionConfig::default()).await;
    fake.fault_next_create(CreateFault::Fail);
    for code in [429, 503, 408] {
        fake.fault_next_create(CreateFault::Refuse {
            code,
            message: format!("busy {code}"),
        });
    }
    let d = dispatch(mission(), 1, Duration::from_secs(10));
    let receipt = kube.dispatch(&d).await.unwrap();
    assert!(!receipt.duplicate);
    let name = d.idempotency_key.to_string();
    let statuses: Vec<u16> = fake.calls().iter().map(|c| c.status).collect();
    assert_eq!(
        statuses,
        [500, 429, 503, 408, 201],
        "{:?}",
        calls(&fake, &name)
    );
    assert_eq!(fake.jobs().len(), 1);
}

#[tokio::test]
async fn kubernetes_refusals_fail_at_once_with_the_servers_message() {
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let kube = backend(&fake, MissionConfig::default()).await;
    fake.fault_next_create(CreateFault::Refuse {
        code: 403,
        message: "exceeded quota: missions, requested: count/jobs.batch=1".into(),
    });
    let d = dispatch(mission(), 1, Duration::from_secs(10));
    let err = kube.dispatch(&d).await.unwrap_err();
    let name = d.idempotency_key.to_string();
    assert!(
        matches!(&err, DispatchError::Rejected(t)
            if t.contains(&format!("jobs.batch \"{name}\" is forbidden: exceeded quota"))
                && t.contains("403 Forbidden")),
        "{err}"
    );
    assert_eq!(fake.calls().len(), 1, "a refusal is not tried again");

    // A namespace that does not exist is the operator's to fix, not a passing fault.
    let elsewhere = backend(
        &fake,
        MissionConfig::from_json(r#"{"kubernetes": {"namespace": "nope"}}"#).unwrap(),
    )
    .await;
    let err = elsewhere
        .dispatch(&dispatch(mission(), 1, Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, DispatchError::Rejected(t) if t.contains("namespaces \"nope\" not found")),
        "{err}"
    );
    assert_eq!(fake.calls().len(), 2);
    assert!(fake.jobs().is_empty());
}

#[tokio::test]
async fn kubernetes_that_keeps_failing_fails_by_the_deadline_with_the_last_answer() {
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let kube = backend(&fake, MissionConfig::default()).await;
    for _ in 0..100 {
        fake.fault_next_create(CreateFault::Fail);
    }
    let within = Duration::from_millis(1500);
    let started = Instant::now();
    let err = kube
        .dispatch(&dispatch(mission(), 1, within))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(took <= within + DEADLINE_SLACK, "{took:?}");
    assert!(
        matches!(&err, DispatchError::Unavailable(t)
            if t.contains("before the deadline") && t.contains("injected failure")),
        "{err}"
    );
    // Tried more than once, with backoff rather than in a tight loop.
    let tries = fake.calls().len();
    assert!((2..=10).contains(&tries), "{tries} tries");
    assert!(fake.jobs().is_empty());
}

#[tokio::test]
async fn kubernetes_create_stored_but_unanswered_is_found_by_the_retry() {
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let kube = backend(&fake, MissionConfig::default()).await;
    fake.fault_next_create(CreateFault::StallAfterCreate);
    let first = dispatch(mission(), 1, Duration::from_millis(500));
    let err = kube.dispatch(&first).await.unwrap_err();
    assert!(
        matches!(&err, DispatchError::Unconfirmed(t) if t.contains("deadline")),
        "{err}"
    );
    let name = first.idempotency_key.to_string();
    let stored = fake.job("default", &name).expect("the create was stored");

    let mut retry = first.clone();
    retry.attempt = 2;
    retry.deadline = Instant::now() + Duration::from_secs(10);
    let receipt = kube.dispatch(&retry).await.unwrap();
    assert!(receipt.duplicate, "{receipt:?}");
    assert_eq!(
        receipt.detail,
        format!("job default/{name} uid {}", stored.uid)
    );
    assert_eq!(fake.jobs().len(), 1);
    assert_eq!(
        calls(&fake, &name),
        [
            "POST /apis/batch/v1/namespaces/default/jobs 0",
            "POST /apis/batch/v1/namespaces/default/jobs 409",
            "GET /apis/batch/v1/namespaces/default/jobs/NAME 200",
        ]
    );
}

#[tokio::test]
async fn kubernetes_job_of_the_name_for_another_occurrence_is_not_taken_for_this_one() {
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let kube = backend(&fake, MissionConfig::default()).await;
    let d = dispatch(mission(), 1, Duration::from_secs(10));
    let name = d.idempotency_key.to_string();
    fake.put_job(
        "default",
        &name,
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"annotations": {KEY_ANNOTATION: "cm-someone-else"}}}),
    );
    let err = kube.dispatch(&d).await.unwrap_err();
    assert!(
        matches!(&err, DispatchError::Rejected(t) if t.contains("another occurrence")),
        "{err}"
    );
}

#[tokio::test]
async fn kubernetes_bad_credentials_are_refused_and_never_printed() {
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let wrong = "wrong-token-7c2e91d04b";
    let file = Kubeconfig::write(&fake.kubeconfig("default").replace(TOKEN, wrong));
    let kube =
        KubernetesDispatcher::from_kubeconfig(&file.0, IMAGE.to_owned(), MissionConfig::default())
            .await
            .unwrap();
    let err = kube
        .dispatch(&dispatch(mission(), 1, Duration::from_secs(10)))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, DispatchError::Rejected(_)) && text.contains("401 Unauthorized"),
        "{text}"
    );
    assert!(!text.contains(wrong) && !format!("{kube:?}").contains(wrong));
    assert_eq!(fake.calls().len(), 1);
    assert!(fake.jobs().is_empty());
}

/// A reply that never ends (or declares a terabyte) is read no further than MAX_REPLY_BYTES:
/// the call fails naming the bound, as any failed call, and is tried again until the deadline;
/// the run is not judged by a part of a reply.
#[tokio::test]
async fn kubernetes_reads_no_reply_past_its_bound() {
    use cm_dispatch::MAX_REPLY_BYTES;
    use cm_dispatch::fakes::{Flood, Framing};
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let kube = backend(&fake, MissionConfig::default()).await;
    let launched = dispatch(mission(), 1, Duration::from_secs(10));
    kube.dispatch(&launched).await.unwrap();
    let job = launched.idempotency_key.to_string();

    // The watch reads the Job: an endless 200 is neither the Job's state nor its absence.
    let endless = Flood {
        status: 200,
        framing: Framing::Chunked,
    };
    fake.flood("GET", &format!("/jobs/{job}"), Some(endless));
    let err = kube
        .observe(
            &RunRef::named(job.clone()),
            Instant::now() + Duration::from_secs(3),
        )
        .await
        .unwrap_err();
    // Not answered, as a read cut short by a reset is.
    assert!(
        matches!(&err, DispatchError::Unavailable(t) | DispatchError::Unconfirmed(t)
            if t.contains("read Job") && t.contains("longer than 16 MiB")),
        "{err}"
    );
    // Each flood was read up to the bound and no further.
    floods_cut(|| fake.floods(), 0, Some(MAX_REPLY_BYTES)).await;

    // A create answered 500 with a terabyte's Content-Length: refused unread, and the launch
    // is unconfirmed (what the API server did is unknown).
    fake.flood("GET", "/none", None);
    let huge = Flood {
        status: 500,
        framing: Framing::HugeLength,
    };
    fake.flood("POST", "/jobs", Some(huge));
    let before = fake.floods().answered;
    let err = kube
        .dispatch(&dispatch(mission(), 1, Duration::from_secs(3)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, DispatchError::Unconfirmed(t)
            if t.contains("create Job") && t.contains("longer than 16 MiB")),
        "{err}"
    );
    floods_cut(|| fake.floods(), before, None).await;
}

#[tokio::test]
async fn kubernetes_that_does_not_answer_is_unavailable() {
    // A port nothing listens on.
    let file = Kubeconfig::write(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n\
         users:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
         current-context: x\n",
    );
    let kube =
        KubernetesDispatcher::from_kubeconfig(&file.0, IMAGE.to_owned(), MissionConfig::default())
            .await
            .unwrap();
    let err = kube
        .dispatch(&dispatch(mission(), 1, Duration::from_millis(800)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, DispatchError::Unavailable(t) if t.contains("deadline")),
        "{err}"
    );
}

#[tokio::test]
async fn kubernetes_refuses_a_user_it_cannot_run_as_before_any_call() {
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let file = Kubeconfig::write(&fake.kubeconfig("default"));
    let config = MissionConfig::from_json(r#"{"user": "mission"}"#).unwrap();
    let err = KubernetesDispatcher::from_kubeconfig(&file.0, IMAGE.to_owned(), config)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("numeric user"), "{err}");
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn kubernetes_job_names_are_valid_for_every_occurrence() {
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let kube = backend(&fake, MissionConfig::default()).await;
    // The widest and the oldest instants, the largest routine id: the fake validates each name
    // as the API server does (a DNS-1123 label, 63 at most).
    for (id, micros) in [
        (u128::MAX, 253_402_300_799_999_999),
        (0, -62_135_596_800_000_000),
        (7, 0),
    ] {
        let mut d = dispatch(mission(), 1, Duration::from_secs(10));
        d.occurrence = Occurrence::new(Uuid::from_u128(id), Utc.timestamp_micros(micros).unwrap());
        d.idempotency_key = d.occurrence.idempotency_key();
        kube.dispatch(&d).await.unwrap();
        let name = d.idempotency_key.to_string();
        assert!(is_dns_label(&name), "{name}");
        assert!(fake.job("default", &name).is_some(), "{name}");
    }
}

#[tokio::test]
async fn kubernetes_rejects_an_invalid_mission_without_a_call() {
    let fake = FakeKubernetes::start(&["default"], TOKEN);
    let kube = backend(&fake, MissionConfig::default()).await;
    for payload in [
        json!({ "repository": "file:///etc/passwd", "task": "x" }),
        json!({ "repository": "https://h.example/r", "task": "x", "env": { "CM_TASK": "y" } }),
        json!({ "text": "a message payload" }),
    ] {
        let err = kube
            .dispatch(&dispatch(payload, 1, Duration::from_secs(10)))
            .await
            .unwrap_err();
        assert!(matches!(err, DispatchError::Rejected(_)), "{err}");
    }
    assert_eq!(fake.calls(), vec![], "nothing reached the API server");
}

/// A self-signed certificate for 127.0.0.1 (valid until 2126), as a kubeconfig's
/// `certificate-authority-data` carries a cluster's CA.
const CA_DATA: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJrakNDQVRpZ0F3SUJBZ0lVUUphblIwVEVrSUJmUmY3Z3lSNFV4Wk5sMHdZd0NnWUlLb1pJemowRUF3SXcKRlRFVE1CRUdBMVVFQXd3S1kyMHRkR1Z6ZEMxallUQWdGdzB5TmpFeE16QXlNRFF5TXpoYUdBOHlNVEkyTVRFdwpOakl3TkRJek9Gb3dGVEVUTUJFR0ExVUVBd3dLWTIwdGRHVnpkQzFqWVRCWk1CTUdCeXFHU000OUFnRUdDQ3FHClNNNDlBd0VIQTBJQUJGdlBKVEI3T3hLandvRUdUNDBuU1J1NllGMVBaYUxKQ25NNzRGTUE5RlI3U3hvT3FadnIKckFnYWhDbGY3Q2dITTRJeFZ2clMxR2ZkQk1aa1FBcXRVSG1qWkRCaU1CMEdBMVVkRGdRV0JCUWRudldtay9NdwpLSjI0bmQ0UythMURhdDJVSkRBZkJnTlZIU01FR0RBV2dCUWRudldtay9Nd0tKMjRuZDRTK2ExRGF0MlVKREFQCkJnTlZIUk1CQWY4RUJUQURBUUgvTUE4R0ExVWRFUVFJTUFhSEJIOEFBQUV3Q2dZSUtvWkl6ajBFQXdJRFNBQXcKUlFJZ09GVHB6NVcxT0k2RURVUGNPaklRSG9rb3Q2R3NoSzAxQ2JGUWRpdVRYYWdDSVFEeGxIbzk3MkpsNmFObgpMdjhIZzhmcjFYOStIeFNCK2xUSmFLMktkWEs1S2c9PQotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==";

#[tokio::test]
async fn kubernetes_over_https_builds_its_tls_client_from_the_kubeconfig() {
    // What a real cluster's kubeconfig looks like: https, the CA inline, a token. Building the
    // client builds its TLS configuration (rustls with the ring provider, nothing installed by
    // hand); nothing listens on the port, so the dispatch fails as unreachable, not as a panic
    // or a refusal.
    let file = Kubeconfig::write(&format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority-data: {CA_DATA}\nusers:\n- name: u\n  user:\n    token: {TOKEN}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
    ));
    let kube =
        KubernetesDispatcher::from_kubeconfig(&file.0, IMAGE.to_owned(), MissionConfig::default())
            .await
            .unwrap();
    let err = kube
        .dispatch(&dispatch(mission(), 1, Duration::from_millis(800)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, DispatchError::Unavailable(t) if t.contains("deadline") && !t.contains(TOKEN)),
        "{err}"
    );
}

/// `kubernetes-validate` (PyPI, the official OpenAPI schemas of each Kubernetes release): the
/// program named by `CM_TEST_KUBERNETES_VALIDATE`, else the one on `PATH`. `.ci/run` installs
/// it; the test that needs it is ignored unless asked for, and fails without it.
fn kubernetes_validate() -> PathBuf {
    let program = std::env::var_os("CM_TEST_KUBERNETES_VALIDATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("kubernetes-validate"));
    match std::process::Command::new(&program)
        .arg("--version")
        .output()
    {
        Ok(out) if out.status.success() => program,
        result => panic!(
            "kubernetes-validate does not run (pip install kubernetes-validate and set \
             CM_TEST_KUBERNETES_VALIDATE; .ci/run does): {result:?}"
        ),
    }
}

#[tokio::test]
#[ignore = "needs kubernetes-validate: pip install kubernetes-validate (in a virtualenv), and set CM_TEST_KUBERNETES_VALIDATE to it"]
async fn the_job_passes_the_official_batch_v1_schema() {
    let validator = kubernetes_validate();
    let fake = FakeKubernetes::start(&["missions"], TOKEN);
    let config = MissionConfig::from_json(
        r#"{"command": ["run-mission", "--verbose"], "user": "1000:1000",
            "kubernetes": {"namespace": "missions", "service_account": "mission-runner",
                           "backoff_limit": 0, "cpu": "500m", "memory": "2Gi"}}"#,
    )
    .unwrap();
    let backend = backend(&fake, config).await;
    let dispatch = mission_dispatch(mission(), 1);
    let launch =
        cm_dispatch::mission::Launch::of(&dispatch, &cm_domain::MissionPolicy::default()).unwrap();
    let mut job = serde_json::to_value(backend.job(&launch, &launch.name)).unwrap();
    job["apiVersion"] = json!("batch/v1");
    job["kind"] = json!("Job");
    let file = std::env::temp_dir().join(format!("cm-job-{}.json", Uuid::new_v4().simple()));
    std::fs::write(&file, job.to_string()).unwrap();
    for version in ["1.25.0", "1.33.0", "1.37.0"] {
        let out = std::process::Command::new(&validator)
            .args(["--strict", "-k", version])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{version}: {}{}\n{job:#}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The validator is no rubber stamp: a field batch/v1 does not have fails it.
    job["spec"]["backoffLimitt"] = json!(1);
    std::fs::write(&file, job.to_string()).unwrap();
    let out = std::process::Command::new(&validator)
        .args(["--strict", "-k", "1.33.0"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(!out.status.success(), "a misspelt field passed the schema");
}

/// The repository's `deploy/kubernetes/`, the manifests an operator applies.
fn deploy_dir() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .join("deploy/kubernetes")
}

/// The object in `deploy/kubernetes/NAME`.
fn manifest(name: &str) -> Value {
    let path = deploy_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// A permission as the fake and `grant_only` name it: `verb resource[/subresource]`.
fn permission(verb: &str, resource: &str, subresource: Option<&str>) -> String {
    match subresource {
        Some(sub) => format!("{verb} {resource}/{sub}"),
        None => format!("{verb} {resource}"),
    }
}

#[tokio::test]
async fn the_role_grants_exactly_what_the_backend_calls() {
    use std::collections::BTreeSet;

    use cm_dispatch::kubernetes::REQUIRED_PERMISSIONS;

    // deploy/kubernetes/role.yaml, rule by rule, against the backend's own list.
    let role = manifest("role.yaml");
    assert_eq!(role["kind"], "Role");
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        let names = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .unwrap_or_else(|| panic!("{key} in {rule}"))
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect()
        };
        for group in names("apiGroups") {
            for resource in names("resources") {
                for verb in names("verbs") {
                    let (resource, sub) = match resource.split_once('/') {
                        Some((r, s)) => (r.to_owned(), Some(s.to_owned())),
                        None => (resource.clone(), None),
                    };
                    granted.insert((verb, group.clone(), resource, sub));
                }
            }
        }
    }
    let required: BTreeSet<(String, String, String, Option<String>)> = REQUIRED_PERMISSIONS
        .iter()
        .map(|(verb, group, resource, sub)| {
            (
                (*verb).to_owned(),
                (*group).to_owned(),
                (*resource).to_owned(),
                sub.map(str::to_owned),
            )
        })
        .collect();
    assert_eq!(granted, required, "role.yaml and REQUIRED_PERMISSIONS");
    let role_grants: Vec<String> = REQUIRED_PERMISSIONS
        .iter()
        .map(|(verb, _, resource, sub)| permission(verb, resource, *sub))
        .collect();
    let role_grants: Vec<&str> = role_grants.iter().map(String::as_str).collect();

    // The backend with the mission config of deploy/kubernetes/configmap.yaml, against a fake
    // API server that grants the token the Role's rules and nothing else, through everything
    // it does: the readiness check, the start-up permission check, a launch, a retry of it, the
    // watch, the report of an ended run (its pod's log) and a stop.
    let configmap = manifest("configmap.yaml");
    let config = MissionConfig::from_json(configmap["data"]["missions.json"].as_str().unwrap())
        .expect("the ConfigMap's mission config");
    let namespace = config.kubernetes.namespace.clone();
    assert_eq!(role["metadata"]["namespace"], namespace.as_str());
    let fake = FakeKubernetes::start(&[&namespace], TOKEN);
    fake.grant_only(Some(&role_grants));
    let kube = backend(&fake, config).await;
    kube.ready().await.expect("ready");
    assert_eq!(
        kube.missing_permissions().await.unwrap(),
        Vec::<String>::new()
    );
    let d = dispatch(mission(), 1, Duration::from_secs(10));
    assert!(!kube.dispatch(&d).await.unwrap().duplicate);
    assert!(kube.dispatch(&d).await.unwrap().duplicate);
    let job = d.idempotency_key.to_string();
    let run = RunRef::named(job.clone());
    let deadline = || Instant::now() + Duration::from_secs(5);
    assert_eq!(
        kube.observe(&run, deadline()).await.unwrap(),
        cm_domain::RunState::Running
    );
    fake.add_pod(&namespace, &job, "done\n");
    assert!(fake.set_job_status(
        &namespace,
        &job,
        json!({ "startTime": "2026-03-29T01:00:01Z", "completionTime": "2026-03-29T01:00:09Z",
                "succeeded": 1, "conditions": [{ "type": "Complete", "status": "True" }] }),
    ));
    assert_eq!(
        kube.observe(&run, deadline()).await.unwrap(),
        cm_domain::RunState::Succeeded
    );
    let report = kube.report(&run, deadline()).await.unwrap();
    assert_eq!(report.output.as_deref(), Some("done\n"));
    kube.stop(&run, deadline()).await.unwrap();
    assert_eq!(fake.job(&namespace, &job), None, "stopped");

    // What it asked for is the Role, and two calls no Role grants: the reviews (every identity
    // may review itself) and the readiness check's list of Jobs, refused here and still read
    // as "the API server answers".
    let asked = fake.permissions_asked();
    let beyond: BTreeSet<&str> = asked
        .iter()
        .map(String::as_str)
        .filter(|p| !role_grants.contains(p))
        .collect();
    assert_eq!(
        beyond,
        BTreeSet::from(["create selfsubjectaccessreviews", "list jobs"]),
        "{asked:?}"
    );
    assert_eq!(
        asked.len(),
        role_grants.len() + beyond.len(),
        "every rule of the Role was used: {asked:?}"
    );
    let listed: Vec<u16> = fake
        .calls()
        .iter()
        .filter(|c| c.method == "GET" && c.path.ends_with("/jobs"))
        .map(|c| c.status)
        .collect();
    assert_eq!(listed, [403], "the readiness check's list");

    // And nothing in it is spare: without any one rule, `run` would refuse to start, naming it.
    for left_out in &role_grants {
        let others: Vec<&str> = role_grants
            .iter()
            .copied()
            .filter(|p| p != left_out)
            .collect();
        fake.grant_only(Some(&others));
        assert_eq!(
            kube.missing_permissions().await.unwrap(),
            [*left_out],
            "without {left_out}"
        );
    }
}

#[tokio::test]
#[ignore = "needs kubernetes-validate: pip install kubernetes-validate (in a virtualenv), and set CM_TEST_KUBERNETES_VALIDATE to it"]
async fn the_deploy_manifests_pass_the_official_schemas() {
    let validator = kubernetes_validate();
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "{files:?}");
    // From the oldest Kubernetes still common to the newest the validator knows.
    for version in ["1.25.0", "1.33.0", "1.37.0"] {
        let out = std::process::Command::new(&validator)
            .args(["--strict", "-k", version])
            .args(&files)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{version}: {said}");
        for file in &files {
            let name = file.file_name().unwrap().to_string_lossy();
            assert!(
                said.lines()
                    .any(|l| l.contains(&*name) && l.contains("passed")),
                "{version}: {name} not said to pass: {said}"
            );
        }
    }
    // The strict schema is no rubber stamp: a misspelt field of the Deployment fails it.
    let text = std::fs::read_to_string(deploy_dir().join("deployment.yaml")).unwrap();
    let misspelt = text.replace("readOnlyRootFilesystem", "readOnlyRootFileSystem");
    assert_ne!(misspelt, text);
    let file = std::env::temp_dir().join(format!("cm-deployment-{}.yaml", Uuid::new_v4().simple()));
    std::fs::write(&file, misspelt).unwrap();
    let out = std::process::Command::new(&validator)
        .args(["--strict", "-k", "1.33.0"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(!out.status.success(), "a misspelt field passed the schema");
}
