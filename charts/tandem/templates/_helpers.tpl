{{/* Names, labels and the image of the tandem chart's objects. */}}

{{- define "tandem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* The operator's objects: "<release>-tandem", or the release name if it already says tandem. */}}
{{- define "tandem.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tandem.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object of the release carries (the CRD adds its own part-of label). */}}
{{- define "tandem.releaseLabels" -}}
helm.sh/chart: {{ include "tandem.chart" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The operator's selector: never carries tandem.dev/pddeployment, which marks a PDDeployment's children. */}}
{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "tandem.labels" -}}
{{ include "tandem.releaseLabels" . }}
app.kubernetes.io/name: {{ include "tandem.name" . }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: tandem
{{- end }}

{{- define "tandem.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tandem.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tandem.leaseName" -}}
{{- default (include "tandem.fullname" .) .Values.operator.leaseName }}
{{- end }}

{{- define "tandem.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The permissions the operator needs in every namespace it reconciles: in a ClusterRole for a
cluster-wide install, in one Role per namespace otherwise. Derived from tandem.render.CHILD_KINDS
(children it applies and prunes) and tandem.controller (reads, status, events, secret checks).
*/}}
{{- define "tandem.namespacedRules" -}}
{{- /* Exactly the calls the operator's code issues: tests/chart/test_rbac_audit.py derives them from
the code and fails on a grant without a use, or a use without a grant. */ -}}
- apiGroups: [tandem.dev]
  resources: [pddeployments]
  verbs: [get, list, watch]
- apiGroups: [tandem.dev]
  resources: [pddeployments/status]
  verbs: [patch]
# Children of a PDDeployment: listed and watched into the operator's caches (tandem.kube.informer),
# server-side applied (a patch that may create) and pruned.
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [list, watch, create, patch, delete]
# A multi-node pool's LeaderWorkerSet (sigs.k8s.io/lws; optional: without its CRD the operator
# reports CRDNotInstalled for such pools). Its replicas are set by server-side apply, not through
# the scale subresource, which the operator never calls.
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [list, watch, create, patch, delete]
# A gang-scheduled multi-node pool's PodGroups (Kubernetes' own gang scheduling, an alpha API:
# optional like LeaderWorkerSet).
- apiGroups: [scheduling.k8s.io]
  resources: [podgroups]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, watch, create, patch, delete]
# The engines' NetworkPolicy (spec.network.policy.enabled).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, create, patch, delete]
# The router's Role and RoleBinding (RBAC lets the operator grant only what it holds itself:
# get/list/watch on pods and pddeployments, and get on the API keys Secret by name).
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [list, watch, create, patch, delete]
# Pod status for readiness and problems (unschedulable, image pulls, crash loops); patch: the
# autoscaler's draining annotation on a pod about to be removed.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
# Only to report a missing image pull secret or model token secret, and a missing or malformed API
# keys Secret (spec.router.auth.apiKeysSecret, read to check that it parses); never listed or watched.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}

{{/* The pod labels the SLO autoscaler's queries select by, on every scraped engine and router target. */}}
{{- define "tandem.workloadRelabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_label_tandem_dev_pddeployment]
  targetLabel: tandem_dev_pddeployment
- sourceLabels: [__meta_kubernetes_pod_label_tandem_dev_role]
  targetLabel: tandem_dev_role
# A serving revision's pods (none on the first, legacy revision): per-revision KV figures.
- sourceLabels: [__meta_kubernetes_pod_label_tandem_dev_revision]
  targetLabel: tandem_dev_revision
{{- end }}
