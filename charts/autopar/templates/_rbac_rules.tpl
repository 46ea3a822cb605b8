{{/*
The operator's RBAC rules, one place for the ClusterRole (every namespace) and the Roles
(watchNamespaces).  Each rule names the code that needs it.  tests/chart/render.py
(`rbac_rules`) extracts them from a render.
*/}}

{{/* Rules in the namespaces the operator watches. */}}
{{- define "autopar.rules.namespaced" -}}
# operator/handlers.py tick (kopf.timer) and forget (kopf.on.delete): kopf lists and watches the
# jobs and patches their annotations (progress and diff-base storage, prefix autopar.dev:
# handlers.startup); operator/handlers.py _execute "delete_job": ttlSecondsAfterFinished.
- apiGroups: ["autopar.dev"]
  resources: ["paralleltrainingjobs"]
  verbs: ["list", "watch", "patch", "delete"]
# operator/handlers.py tick: kopf writes the timer's patch.status to the status subresource.
- apiGroups: ["autopar.dev"]
  resources: ["paralleltrainingjobs/status"]
  verbs: ["patch"]
# operator/resources.py owner_reference: every child is created with blockOwnerDeletion, which
# the OwnerReferencesPermissionEnforcement admission plugin allows only with update on the
# owner's finalizers.
- apiGroups: ["autopar.dev"]
  resources: ["paralleltrainingjobs/finalizers"]
  verbs: ["update"]
# operator/handlers.py gpus_index and pods_index (kopf.index: list, watch); _execute "create"
# (resources.trainer_pod) and "delete" (reconcile._delete_pods: gang restart, suspend, deadline).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete"]
# operator/handlers.py configmaps_index (list, watch); _execute "create"
# (resources.topology_configmap, resources.plan_configmap) and "delete" (reconcile: the
# topology ConfigMap of a changed topology).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "watch", "create", "delete"]
# operator/handlers.py services_index (list, watch); _execute "create" (resources.trainer_service).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create"]
# operator/handlers.py _execute "create": resources.planner_serviceaccount, trainer_serviceaccount.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["create"]
# operator/handlers.py _execute "event" (resources.event); kopf posts its own Events for
# warnings (handlers.startup: settings.posting.level).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# operator/handlers.py jobs_index (list, watch); _execute "create" (resources.planner_job).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create"]
# operator/handlers.py _execute "create": resources.planner_role, progress_role (their rules are
# in the delegate role below) and resources.planner_rolebinding, progress_rolebinding.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create"]
{{- if and (include "autopar.peering" .) .Values.watchNamespaces }}
# operator/handlers.py run (--peering, namespaced): kopf's peering
# (kopf/_core/engines/peering.py process_peering_event through a watcher: list, watch;
# touch and clean: patch) on the KopfPeering of each watched namespace.
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end }}

{{/* Cluster-scoped rules: always a ClusterRole. */}}
{{- define "autopar.rules.cluster" -}}
# operator/handlers.py nodes_index (kopf.index on nodes, cluster-scoped: list, watch): the
# topology (operator/discovery.py) and the free GPUs.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
# kopf's resource observer (kopf/_core/reactor/observation.py resource_observer): list, watch
# CustomResourceDefinitions to notice the CRD being (re)installed.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if .Values.watchNamespaces }}
# kopf's namespace observer (kopf/_core/reactor/observation.py namespace_observer): with
# --namespace it lists and watches namespaces to match them.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- else if include "autopar.peering" . }}
# operator/handlers.py run (--peering, clusterwide): kopf's peering
# (kopf/_core/engines/peering.py process_peering_event through a watcher: list, watch;
# touch and clean: patch) on the ClusterKopfPeering.
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end }}

{{/*
What the planner and trainer pods may do: the rules of operator/resources.py planner_role and
progress_role without their per-job resourceNames.  The operator uses none of them itself; it
holds them because RBAC lets it create a Role only with permissions it has (no escalate or bind
verb, which would let it grant anything).
*/}}
{{- define "autopar.rules.delegate" -}}
# operator/resources.py planner_role: operator/podside.py publish_plan (get, patch the plan
# ConfigMap <job>-plan).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "patch"]
# operator/resources.py progress_role: operator/podside.py report_progress (get, patch the
# job's status).
- apiGroups: ["autopar.dev"]
  resources: ["paralleltrainingjobs/status"]
  verbs: ["get", "patch"]
# operator/resources.py planner_role and progress_role: Events of the planner and trainer pods.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
