{{/*
Names and labels shared by every template.
*/}}

{{- define "shardops.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The name prefix of namespaced objects: "<release>-shardops", or the release name when it already says shardops. */}}
{{- define "shardops.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "shardops.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The name prefix of cluster-scoped objects (ClusterRoles, ClusterRoleBindings, admission policies):
the fullname plus the release namespace, so that releases of the same name in two namespaces (for
example two teams, each watching its own namespaces) never share or fight over an object.
*/}}
{{- define "shardops.clusterName" -}}
{{- printf "%s-%s" (include "shardops.fullname" .) .Release.Namespace | trunc 200 | trimSuffix "-" -}}
{{- end -}}

{{- define "shardops.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shardops.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardops.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "shardops.labels" -}}
helm.sh/chart: {{ include "shardops.chart" . }}
{{ include "shardops.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shardops
{{- end -}}

{{- define "shardops.operatorSelectorLabels" -}}
{{ include "shardops.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "shardops.operatorServiceAccount" -}}
{{- default (printf "%s-operator" (include "shardops.fullname" .)) .Values.operator.serviceAccount.name -}}
{{- end -}}

{{- define "shardops.workerServiceAccount" -}}
{{- .Values.workers.serviceAccount.name -}}
{{- end -}}

{{- define "shardops.leaseName" -}}
{{- default (printf "%s-operator" (include "shardops.fullname" .)) .Values.operator.leaderElection.leaseName -}}
{{- end -}}

{{- define "shardops.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* JSON list of the namespaces whose Campaigns the operator serves; [] means every namespace. */}}
{{- define "shardops.watchNamespaces" -}}
{{- toJson (uniq .Values.watch.namespaces) -}}
{{- end -}}

{{/* JSON list of the namespaces that get the worker ServiceAccount and RoleBinding. Watching every
namespace, none unless listed: the release namespace holds the leader Lease (templates/validate.yaml). */}}
{{- define "shardops.workerNamespaces" -}}
{{- $namespaces := .Values.workers.namespaces -}}
{{- if not $namespaces -}}{{- $namespaces = .Values.watch.namespaces -}}{{- end -}}
{{- if and (not $namespaces) .Values.workers.allowReleaseNamespace -}}{{- $namespaces = list .Release.Namespace -}}{{- end -}}
{{- toJson (uniq $namespaces) -}}
{{- end -}}

{{/*
Checks across values that the JSON schema cannot express; each failure names the values and the fix.
*/}}
{{- define "shardops.validate" -}}
{{- $pdb := .Values.operator.podDisruptionBudget -}}
{{- if gt (int .Values.operator.replicas) 1 -}}
{{- if not .Values.operator.leaderElection.enabled -}}
{{- fail (printf "operator.replicas is %d but operator.leaderElection.enabled is false: without leader election every replica would schedule the same campaigns; set operator.leaderElection.enabled=true or operator.replicas=1" (int .Values.operator.replicas)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service.enabled) -}}
{{- fail "metrics.serviceMonitor.enabled needs the metrics Service it points at: set metrics.service.enabled=true" -}}
{{- end -}}
{{- if and $pdb.enabled (gt (int .Values.operator.replicas) 1) (not (kindIs "string" $pdb.minAvailable)) -}}
{{- if ge (int $pdb.minAvailable) (int .Values.operator.replicas) -}}
{{- fail (printf "operator.podDisruptionBudget.minAvailable (%d) must be less than operator.replicas (%d): otherwise no node running an operator pod could ever be drained; lower minAvailable or raise replicas" (int $pdb.minAvailable) (int .Values.operator.replicas)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.watch.namespaces .Values.workers.namespaces -}}
{{- range .Values.workers.namespaces -}}
{{- if not (has . $.Values.watch.namespaces) -}}
{{- fail (printf "workers.namespaces lists %q, which is not in watch.namespaces %v: the operator would never run Campaigns there; add it to watch.namespaces or remove it from workers.namespaces" . $.Values.watch.namespaces) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.workers.metrics.podMonitor.enabled (not .Values.workers.metrics.enabled) -}}
{{- fail "workers.metrics.podMonitor.enabled needs worker pods that serve metrics: set workers.metrics.enabled=true" -}}
{{- end -}}
{{- if and .Values.workers.metrics.podMonitor.enabled (not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PodMonitor")) -}}
{{- fail "workers.metrics.podMonitor.enabled is true but this cluster has no monitoring.coreos.com/v1 PodMonitor (install the Prometheus Operator CRDs first, or with helm template pass --api-versions monitoring.coreos.com/v1/PodMonitor); or set workers.metrics.podMonitor.enabled=false" -}}
{{- end -}}
{{- if .Values.batchAPI.enabled -}}
{{- if not .Values.batchAPI.sourceRef.name -}}
{{- fail "batchAPI.enabled needs the Source or ClusterSource every batch's requests go through: set batchAPI.sourceRef.name (and batchAPI.sourceRef.kind)" -}}
{{- end -}}
{{- if or (ne .Values.resultStore.type "S3") (not .Values.resultStore.s3.bucket) -}}
{{- fail "batchAPI.enabled needs the S3 result store, where uploaded files and batches' results live: set resultStore.type=S3 and resultStore.s3.bucket" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor")) -}}
{{- fail "metrics.serviceMonitor.enabled is true but this cluster has no monitoring.coreos.com/v1 ServiceMonitor (install the Prometheus Operator CRDs first, or with helm template pass --api-versions monitoring.coreos.com/v1/ServiceMonitor); or set metrics.serviceMonitor.enabled=false" -}}
{{- end -}}
{{- end -}}

{{- /*
The installation's result store and the keys that reach every namespace's area: the environment of
the two processes that use them, the operator and the Batch API service (store.installation).
*/ -}}
{{- define "shardops.storeEnv" -}}
- name: SHARDOPS_RESULT_STORE
  value: {{ .Values.resultStore.type | quote }}
- name: SHARDOPS_STORE_SECRET
  value: {{ .Values.resultStore.namespaceSecret | quote }}
{{- with .Values.resultStore.s3 }}
{{- if .endpoint }}
- name: SHARDOPS_S3_ENDPOINT
  value: {{ .endpoint | quote }}
{{- end }}
{{- if .region }}
- name: SHARDOPS_S3_REGION
  value: {{ .region | quote }}
{{- end }}
{{- if .bucket }}
- name: SHARDOPS_S3_BUCKET
  value: {{ .bucket | quote }}
{{- end }}
- name: SHARDOPS_S3_PREFIX
  value: {{ .prefix | quote }}
{{- if .credentialsSecret }}
# The installation's own S3 credentials (the operator checks the bucket before a campaign's first
# shard; the Batch API stores uploads and reads results); workers get their namespace's Secret
# (SHARDOPS_STORE_SECRET), never these.
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .credentialsSecret | quote }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .credentialsSecret | quote }}
      key: AWS_SECRET_ACCESS_KEY
{{- end }}
{{- end }}
{{- end }}
