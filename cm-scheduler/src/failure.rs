//! Why a command or the service's start-up failed, split by whose fault it is: bad input (the
//! command line exits 2, nothing was written) or anything else (exit 1). Each is one line for
//! the operator.

use cm_store::StoreError;

use crate::operations::OperationError;

/// A failure, split by whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The input is wrong; nothing was written.
    Input(String),
    /// Something else failed: the database, a runtime, the network.
    Other(String),
}

impl Failure {
    /// The one line that says what failed.
    pub fn message(&self) -> &str {
        match self {
            Failure::Input(message) | Failure::Other(message) => message,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Failure {}

/// A store error about the input (a routine that does not exist, a name taken, a change the
/// domain refuses) is bad input; any other is explained in one line.
impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::RoutineNotFound(_)
            | StoreError::RoutineNameNotFound(_)
            | StoreError::NameTaken(_)
            | StoreError::InvalidRoutine(_)
            | StoreError::CalendarNotFound(_)
            | StoreError::CalendarNameTaken(_)
            | StoreError::CalendarInUse { .. }
            | StoreError::InvalidCalendar(_) => Failure::Input(e.to_string()),
            other => Failure::Other(other.explain()),
        }
    }
}

impl From<OperationError> for Failure {
    fn from(e: OperationError) -> Self {
        match e {
            OperationError::Refused(message) => Failure::Input(message),
            OperationError::Store(e) => e.into(),
        }
    }
}

/// Bad input, in words.
pub(crate) fn input(message: impl Into<String>) -> Failure {
    Failure::Input(message.into())
}
