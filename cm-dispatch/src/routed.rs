//! Routing by kind: message routines to the message backend, missions to the mission backend.

use std::sync::Arc;

use async_trait::async_trait;
use cm_domain::RoutineKind;
use cm_store::InClaimEffect;

use crate::{Dispatch, DispatchError, Dispatcher, Receipt};

/// Sends each dispatch to the backend for its routine's kind.
///
/// A kind with no backend fails its dispatches with [`DispatchError::NoBackend`], which settles
/// the occurrence `failed` with that reason rather than leaving it owed forever.
#[derive(Clone)]
pub struct RoutedDispatcher {
    message: Option<Arc<dyn Dispatcher>>,
    mission: Option<Arc<dyn Dispatcher>>,
}

impl RoutedDispatcher {
    /// Routes messages to `message` and missions to `mission`.
    pub fn new(message: Option<Arc<dyn Dispatcher>>, mission: Option<Arc<dyn Dispatcher>>) -> Self {
        RoutedDispatcher { message, mission }
    }

    fn backend(&self, kind: RoutineKind) -> Option<&Arc<dyn Dispatcher>> {
        match kind {
            RoutineKind::Message => self.message.as_ref(),
            RoutineKind::Mission => self.mission.as_ref(),
        }
    }
}

impl std::fmt::Debug for RoutedDispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutedDispatcher")
            .field("message", &self.message.is_some())
            .field("mission", &self.mission.is_some())
            .finish()
    }
}

#[async_trait]
impl Dispatcher for RoutedDispatcher {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        match self.backend(dispatch.kind) {
            Some(backend) => backend.dispatch(dispatch).await,
            None => Err(DispatchError::NoBackend(dispatch.kind)),
        }
    }

    fn in_claim_effect(&self, kind: RoutineKind) -> Option<InClaimEffect> {
        self.backend(kind)?.in_claim_effect(kind)
    }
}
