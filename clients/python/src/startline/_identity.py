"""Job identity and rank from the environment, by the rules the Startline adapters and the node agent use.

The rules (one table of cases, ``tests/fixtures/job_identity.json``, is checked against both this module and the
Rust adapters):

1. ``STARTLINE_JOB_ID``, as given.
2. Slurm: ``slurm/<SLURM_CLUSTER_NAME or default>/<job>``, an array task's job being
   ``<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>``; a requeued job (``SLURM_RESTART_COUNT`` n) is attempt n + 1,
   as the Slurm adapter numbers attempts.
3. A Kubernetes job's pod: ``k8s/<STARTLINE_CLUSTER or default>/<STARTLINE_K8S_NAMESPACE or
   POD_NAMESPACE>/<job>``, the job the first non-empty of ``STARTLINE_K8S_JOBSET_NAME``,
   ``STARTLINE_K8S_KUBEFLOW_JOB_NAME``, ``STARTLINE_K8S_JOB_NAME`` (set from the pod's labels through the
   downward API); any other pod: ``kubernetes/<POD_NAMESPACE>/<POD_NAME>``.
4. SageMaker: ``sagemaker/<STARTLINE_NAMESPACE or default>/<TRAINING_JOB_NAME>`` (or the ``job_name`` of
   ``SM_TRAINING_ENV``), the namespace the one the SageMaker adapter is given.
5. Vertex AI: ``vertex/<project>/<location>/<CLOUD_ML_JOB_ID>``, the project the Vertex AI adapter is given
   (``STARTLINE_PROJECT``, else ``CLOUD_ML_PROJECT_ID``) and the location ``STARTLINE_LOCATION`` (else
   ``CLOUD_ML_REGION``).
6. Azure ML: ``azureml/<resource group>/<workspace>/<AZUREML_RUN_ID>``, the resource group and workspace
   ``STARTLINE_RESOURCE_GROUP``/``STARTLINE_WORKSPACE`` (else Azure ML's ``AZUREML_ARM_RESOURCEGROUP``/
   ``AZUREML_ARM_WORKSPACE_NAME``).
"""

import json
from typing import Mapping, Optional, Tuple

K8S_JOB_ENV = ("STARTLINE_K8S_JOBSET_NAME", "STARTLINE_K8S_KUBEFLOW_JOB_NAME", "STARTLINE_K8S_JOB_NAME")


def _get(env: Mapping[str, str], key: str) -> str:
    return (env.get(key) or "").strip()


def job_identity(env: Mapping[str, str]) -> Tuple[Optional[str], Optional[int]]:
    """The job id and attempt (``None`` when the environment does not say) the environment gives."""
    explicit = _get(env, "STARTLINE_JOB_ID")
    if explicit:
        return explicit, None
    slurm = _get(env, "SLURM_JOB_ID")
    if slurm:
        cluster = _get(env, "SLURM_CLUSTER_NAME") or "default"
        array, task = _get(env, "SLURM_ARRAY_JOB_ID"), _get(env, "SLURM_ARRAY_TASK_ID")
        job = f"{array}_{task}" if array and task else slurm
        restarts = _get(env, "SLURM_RESTART_COUNT")
        attempt = int(restarts) + 1 if restarts.isdigit() else None
        return f"slurm/{cluster}/{job}", attempt
    namespace = _get(env, "STARTLINE_K8S_NAMESPACE") or _get(env, "POD_NAMESPACE")
    k8s_job = next((_get(env, k) for k in K8S_JOB_ENV if _get(env, k)), "")
    if namespace and k8s_job:
        cluster = _get(env, "STARTLINE_CLUSTER") or "default"
        return f"k8s/{cluster}/{namespace}/{k8s_job}", None
    if _get(env, "POD_NAMESPACE") and _get(env, "POD_NAME"):
        return f"kubernetes/{_get(env, 'POD_NAMESPACE')}/{_get(env, 'POD_NAME')}", None
    sagemaker = _get(env, "TRAINING_JOB_NAME")
    if not sagemaker and _get(env, "SM_TRAINING_ENV"):
        try:
            sagemaker = str(json.loads(env["SM_TRAINING_ENV"]).get("job_name") or "").strip()
        except (ValueError, AttributeError):
            sagemaker = ""
    if sagemaker:
        return f"sagemaker/{_get(env, 'STARTLINE_NAMESPACE') or 'default'}/{sagemaker}", None
    vertex = _get(env, "CLOUD_ML_JOB_ID")
    if vertex:
        project = _get(env, "STARTLINE_PROJECT") or _get(env, "CLOUD_ML_PROJECT_ID")
        location = _get(env, "STARTLINE_LOCATION") or _get(env, "CLOUD_ML_REGION")
        if project and location:
            return f"vertex/{project}/{location}/{vertex}", None
    azure = _get(env, "AZUREML_RUN_ID")
    if azure:
        group = _get(env, "STARTLINE_RESOURCE_GROUP") or _get(env, "AZUREML_ARM_RESOURCEGROUP")
        workspace = _get(env, "STARTLINE_WORKSPACE") or _get(env, "AZUREML_ARM_WORKSPACE_NAME")
        if group and workspace:
            return f"azureml/{group}/{workspace}/{azure}", None
    return None, None


def global_rank(env: Mapping[str, str]) -> int:
    """This process's global rank: ``RANK`` (torchrun, Lightning, Accelerate), else ``SLURM_PROCID`` (srun),
    else ``LOCAL_RANK`` (a single-node launcher that sets only it), else 0."""
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        value = _get(env, key)
        if value.isdigit():
            return int(value)
    return 0
