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
{{- if and .Values.metrics.serviceMonitor.enabled (not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor")) -}}
{{- fail "metrics.serviceMonitor.enabled is true but this cluster has no monitoring.coreos.com/v1 ServiceMonitor (install the Prometheus Operator CRDs first, or with helm template pass --api-versions monitoring.coreos.com/v1/ServiceMonitor); or set metrics.serviceMonitor.enabled=false" -}}
{{- end -}}
{{- end -}}
