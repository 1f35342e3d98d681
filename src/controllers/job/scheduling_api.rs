//! The scheduling API a job keeps: muster's or upstream's, recorded on the job on its first sync.

use kube::ResourceExt;
use kube::runtime::reflector;

use super::JobContext;
use super::groups::is_child;
use crate::controllers::context::Result;
use crate::controllers::controller_uid;
use crate::crds::SCHEDULING_API_ANNOTATION;
use crate::crds::batch::MusterJob;
use crate::workloadbuilder::native::{self, SchedulingApi};

/// The scheduling API of `job`: the one recorded on it (`batch.muster.dev/scheduling-api`),
/// or, on its first sync, the one chosen now ([`native::first_scheduling_api`]), recorded before
/// anything is compiled, so the job keeps it whatever `--scheduling-api` says later.
pub(super) async fn scheduling_api(
    job: &MusterJob,
    jc: &JobContext,
) -> Result<std::result::Result<SchedulingApi, (&'static str, String)>> {
    let ctx = &*jc.ctx;
    let (ns, name, uid) = (job.namespace().unwrap_or_default(), job.name_any(), job.uid());
    let mine = |owner: Option<&str>| owner == uid.as_deref();
    let muster_group =
        jc.groups.get(&reflector::ObjectRef::new(&name).within(&ns)).is_some_and(|g| mine(controller_uid(&g.metadata)));
    if let Some(recorded) = job.annotations().get(SCHEDULING_API_ANNOTATION) {
        let native_group = jc
            .native_groups
            .as_ref()
            .and_then(|s| s.get(&reflector::ObjectRef::new(&name).within(&ns)))
            .is_some_and(|g| mine(controller_uid(&g.metadata)));
        let served = ctx.config.native_scheduling_served && (!is_child(job) || ctx.config.native_composite_served);
        let dropped = ctx.config.native_fields.dropped_by_job(&job.spec, "spec.scheduling");
        return Ok(native::recorded_scheduling_api(recorded, muster_group, native_group, served, &dropped));
    }
    let dropped = ctx.config.native_fields.dropped_by_job(&job.spec, "spec.scheduling");
    let (api, why) = native::first_scheduling_api(is_child(job), ctx.config.scheduling_api, muster_group, &dropped);
    crate::controllers::record_scheduling_api(ctx, job, api, why).await?;
    Ok(Ok(api))
}
