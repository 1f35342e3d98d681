//! The gang attempt new pods carry: the rollbacks of the job's root gang so far, read from the
//! API server.

use kube::api::Api;

use super::groups::Groups;
use crate::controllers::context::{Context, Error, Result};
use crate::crds::scheduling::{CompositePodGroup, MAX_DEPTH, PodGroup};
use crate::workloadbuilder::native::SchedulingApi;

/// Rollbacks of the job's root gang so far (its `status.rollbacks`), read from the API server,
/// not a cache: new pods carry it as their `scheduling.muster.dev/gang-attempt`, and a cache
/// could still show the count before the rollback whose deleted pods they replace. Read only
/// when pods are created, unless this reconcile created the group (its answer says). A
/// standalone job's PodGroup is its root; a child's root is the top CompositePodGroup.
pub(super) async fn admission_attempt(ctx: &Context, ns: &str, groups: &Groups) -> Result<i32> {
    if groups.api == SchedulingApi::Upstream {
        // kube-scheduler admits the gang; muster never rolls it back.
        return Ok(0);
    }
    match (&groups.parent, groups.created_rollbacks) {
        (None, Some(rollbacks)) => Ok(rollbacks),
        (None, None) => {
            let pg = Api::<PodGroup>::namespaced(ctx.client.clone(), ns).get_opt(&groups.pod_group).await?;
            Ok(pg.and_then(|g| g.status).map_or(0, |s| s.rollbacks))
        }
        (Some(parent), _) => {
            let cpg = Api::<CompositePodGroup>::namespaced(ctx.client.clone(), ns)
                .get_opt(parent)
                .await?
                .ok_or_else(|| Error::Missing(format!("parent CompositePodGroup {parent} not found yet")))?;
            root_rollbacks(ctx, ns, cpg).await
        }
    }
}

/// The rollbacks recorded on the root of the CompositePodGroup tree `cpg` belongs to.
async fn root_rollbacks(ctx: &Context, ns: &str, mut cpg: CompositePodGroup) -> Result<i32> {
    let api = Api::<CompositePodGroup>::namespaced(ctx.client.clone(), ns);
    for _ in 0..MAX_DEPTH {
        let Some(parent) = cpg.spec.parent_composite_pod_group_name.clone() else { break };
        match api.get_opt(&parent).await? {
            Some(p) => cpg = p,
            None => break,
        }
    }
    Ok(cpg.status.as_ref().map_or(0, |s| s.rollbacks))
}
