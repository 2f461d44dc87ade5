//! The hidden `__complete-routine` command the completion scripts call (see
//! `cm_scheduler::flags::completions`): the names of routines starting with a prefix, from the
//! database, nothing when it does not answer in time.

use std::time::Duration;

use cm_scheduler::flags::completions::NAMES;
use cm_store::PgStore;

use super::out;

/// How long completing a name may wait for the database before offering nothing.
const DATABASE_WAIT: Duration = Duration::from_secs(2);

/// `__complete-routine PREFIX`: the names of routines starting with `prefix`, one a line;
/// nothing at all when the database cannot say.
pub(super) async fn routine_names(url: &str, prefix: &str) {
    let names = async {
        let options = super::database::store_options(cm_store::StoreOptions::default());
        let store = PgStore::connect_lazy_with(url, &options).ok()?;
        store.routine_names(prefix, NAMES).await.ok()
    };
    if let Ok(Some(names)) = tokio::time::timeout(DATABASE_WAIT, names).await {
        for name in names {
            out::line(format_args!("{name}"));
        }
    }
}
