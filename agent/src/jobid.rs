//! Job ids that more than one part of the agent makes, defined once so they agree: the node agent names a pod's
//! job from its environment and the Kubernetes/Kueue adapter names the same job from its objects.

/// A Kubernetes job's id: `k8s/<cluster>/<namespace>/<job name>` (the job name from the JobSet, Kubeflow job or
/// Job label of its pods).
pub fn kubernetes(cluster: &str, namespace: &str, job_name: &str) -> String {
    format!("k8s/{cluster}/{namespace}/{job_name}")
}
