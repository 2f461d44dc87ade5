//! cm-dispatch's integration tests, one binary (an index of the modules below, one line each
//! saying what the module proves). They wait for a state (a run ended, a child exited, a
//! container gone) with `cm_dispatch::fakes::wait`, not by sleeping.

// The conformance suite holds for the memory, outbox and routed backends.
#[path = "dispatch/conformance.rs"]
mod conformance;

// A webhook receiver that verifies signatures (`fakes::standard_webhooks`) and answers as told.
#[cfg(feature = "webhook")]
#[path = "dispatch/receiver.rs"]
pub mod receiver;

// The webhook backend against that receiver: signed, retried, deduplicated, within deadlines.
#[cfg(feature = "webhook")]
#[path = "dispatch/webhook.rs"]
mod webhook;

// The NATS backend against JetStream at 127.0.0.1:4222, behind `nats_proxy`'s faults.
#[cfg(feature = "nats")]
#[path = "dispatch/nats.rs"]
mod nats;

// A TCP proxy in front of NATS that stalls or refuses publishes on command.
#[cfg(feature = "nats")]
#[path = "dispatch/nats_proxy.rs"]
mod nats_proxy;

// The mission backends: the process runner for real, Docker against its fake.
#[path = "dispatch/missions.rs"]
mod missions;

// The Docker backend against a real engine (`.ci/dockerd`, `CM_TEST_DOCKER_HOST`).
#[path = "dispatch/docker_engine.rs"]
mod docker_engine;

// The Kubernetes mission backend against the fake API server, held to the Role's rules.
#[path = "dispatch/kubernetes.rs"]
mod kubernetes;
