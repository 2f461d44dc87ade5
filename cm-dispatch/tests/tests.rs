//! cm-dispatch's integration tests, one binary (an index of the modules below).
//!
//! - `conformance`: the conformance suite against the memory, outbox and routed backends.
//! - `receiver`: a real HTTP server on 127.0.0.1 that verifies Standard Webhooks signatures
//!   with its own implementation of the scheme, records deliveries and answers as scripted.
//! - `webhook`: the webhook backend against that receiver (feature `webhook`).
//! - `nats`: the NATS backend against the JetStream server at 127.0.0.1:4222 (feature `nats`),
//!   through the conformance suite with `nats_proxy` between them to stall and refuse publishes.
//! - `missions`: the mission backends (process runner for real, Docker against its fake).
//! - `docker_engine`: the Docker backend against a real engine (`.ci/dockerd`, `CM_TEST_DOCKER_HOST`).
//! - `kubernetes`: the Kubernetes mission backend against the fake API server.

#[path = "dispatch/missions.rs"]
mod missions;

#[path = "dispatch/docker_engine.rs"]
mod docker_engine;

#[path = "dispatch/kubernetes.rs"]
mod kubernetes;

#[path = "dispatch/conformance.rs"]
mod conformance;
#[cfg(feature = "nats")]
#[path = "dispatch/nats.rs"]
mod nats;
#[cfg(feature = "nats")]
#[path = "dispatch/nats_proxy.rs"]
mod nats_proxy;
#[cfg(feature = "webhook")]
#[path = "dispatch/receiver.rs"]
pub mod receiver;
#[cfg(feature = "webhook")]
#[path = "dispatch/webhook.rs"]
mod webhook;
