{{/*
Helpers. Every helper takes a context with .Values (this chart's values) and
.Release; "sluice.context" makes one from an application chart's root
context, so that the sidecar templates name the same objects as this chart.
*/}}

{{- define "sluice.name" -}}
{{- default "sluice" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "sluice.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* fullname with a suffix (list CONTEXT SUFFIX): fullname shortened so
that the whole stays a valid name (63 characters), the suffix kept whole
so that names stay distinct. */}}
{{- define "sluice.suffixed" -}}
{{- $suffix := index . 1 -}}
{{- include "sluice.fullname" (index . 0) | trunc (sub 63 (len $suffix) | int) | trimSuffix "-" -}}
{{- $suffix -}}
{{- end -}}

{{/* This chart's values and the release, as YAML: from this chart's own
context, or from an application chart that has this chart as the
dependency "sluice". Read with fromYaml. */}}
{{- define "sluice.context" -}}
{{- $values := .Values -}}
{{- if and (ne .Chart.Name "sluice") (hasKey .Values "sluice") -}}
{{- $values = .Values.sluice -}}
{{- end -}}
{{- $chart := .Chart -}}
{{- if ne .Chart.Name "sluice" -}}
{{- $chart = .Subcharts.sluice.Chart -}}
{{- end -}}
{{- $release := dict "Name" .Release.Name "Namespace" .Release.Namespace "Service" .Release.Service -}}
{{- dict "Values" $values "Release" $release "Chart" (dict "AppVersion" $chart.AppVersion) | toYaml -}}
{{- end -}}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sluice.labels" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: {{ .Values.mode }}
helm.sh/chart: sluice
{{- end -}}

{{/* The label an application's pods carry when they have the sidecar: the
metrics Service and the NetworkPolicy select on it. */}}
{{- define "sluice.sidecarLabel" -}}
sluice/sidecar: {{ include "sluice.fullname" . }}
{{- end -}}

{{/* REPOSITORY@DIGEST when image.digest is set, else REPOSITORY:TAG. */}}
{{- define "sluice.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* A sluice size (800M, 2G, 1048576, 1.5G; binary units, KiB/MiB too) in
bytes, as byte_size in sluice/commands/proxy.py reads it. */}}
{{- define "sluice.sizeBytes" -}}
{{- $raw := . -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- $raw = int64 . | toString -}}
{{- end -}}
{{- $text := upper (trim (toString $raw)) | trimSuffix "B" | trimSuffix "I" -}}
{{- $units := dict "K" 1024 "M" 1048576 "G" 1073741824 "T" 1099511627776 -}}
{{- $unit := regexFind "[KMGT]$" $text -}}
{{- $number := trimSuffix $unit $text -}}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?$" $number) -}}
{{- fail (printf "%v is not a size (e.g. 800M, 2G)" $raw) -}}
{{- end -}}
{{- mulf (float64 $number) (get $units $unit | default 1) | floor | int64 -}}
{{- end -}}

{{/* A Kubernetes quantity (1Gi, 900Mi, 1G, 500M, 1073741824) in bytes. */}}
{{- define "sluice.quantityBytes" -}}
{{- $text := trim (toString .) -}}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- $unit := regexFind "([KMGT]i|[kMGT])$" $text -}}
{{- $number := trimSuffix $unit $text -}}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?$" $number) -}}
{{- fail (printf "%v is not a Kubernetes quantity of bytes (e.g. 1Gi)" .) -}}
{{- end -}}
{{- mulf (float64 $number) (get $units $unit | default 1) | floor | int64 -}}
{{- end -}}

{{- define "sluice.recording" -}}
{{- if not (has .Values.recording.mode (list "off" "ring" "directory")) -}}
{{- fail (printf "recording.mode must be off, ring or directory, not %v" .Values.recording.mode) -}}
{{- end -}}
{{- ne .Values.recording.mode "off" | ternary "true" "" -}}
{{- end -}}

{{/* The recordings volume's size: recording.volume.size, or retainBytes plus
a quarter; refused when not above retainBytes. */}}
{{- define "sluice.recordingSize" -}}
{{- $retain := include "sluice.sizeBytes" .Values.recording.retainBytes | int64 -}}
{{- $size := .Values.recording.volume.size -}}
{{- if $size -}}
{{- if le (include "sluice.quantityBytes" $size | int64) $retain -}}
{{- fail (printf "recording.volume.size %v must be above recording.retainBytes %v (%d bytes)" $size .Values.recording.retainBytes $retain) -}}
{{- end -}}
{{- $size -}}
{{- else -}}
{{- $mi := div (add (div (mul $retain 5) 4) 1048575) 1048576 -}}
{{- printf "%dMi" $mi -}}
{{- end -}}
{{- end -}}

{{/* The container's resources (the gateway's or the sidecar's). */}}
{{- define "sluice.resources" -}}
{{- toJson (eq .Values.mode "gateway" | ternary .Values.gateway.resources .Values.sidecar.resources) -}}
{{- end -}}

{{/* The number of workers for the sizing checks. auto is one per CPU the
process may use, capped by the cgroup quota rounded up
(sluice/proxy/workers.py available_cpus): ceil(limits.cpu). Without a CPU
limit it would be every CPU of whatever node the pod lands on, which no
check here can size: refused. */}}
{{- define "sluice.workerCount" -}}
{{- $w := toString .Values.workers -}}
{{- if eq $w "auto" -}}
{{- $where := printf "%s.resources.limits.cpu" .Values.mode -}}
{{- $cpu := dig "limits" "cpu" "" (include "sluice.resources" . | fromJson) | toString -}}
{{- if not $cpu -}}
{{- fail (printf "workers auto needs %s: without a CPU limit auto starts a worker per CPU of the node, which the ring and memory checks cannot size (set the limit, or a number of workers)" $where) -}}
{{- end -}}
{{- if regexMatch "^[0-9]+m$" $cpu -}}
{{- max 1 (div (add (trimSuffix "m" $cpu | int64) 999) 1000) -}}
{{- else if regexMatch "^[0-9]+(\\.[0-9]+)?$" $cpu -}}
{{- max 1 (ceil (float64 $cpu) | int64) -}}
{{- else -}}
{{- fail (printf "%s %v is not a CPU quantity (e.g. 2, 1500m)" $where $cpu) -}}
{{- end -}}
{{- else if regexMatch "^[1-9][0-9]*$" $w -}}{{ $w }}{{- else -}}
{{- fail (printf "workers must be a positive number or auto, not %v" .Values.workers) -}}
{{- end -}}
{{- end -}}

{{/* Checks that need several values at once; fails with one line. */}}
{{- define "sluice.validate" -}}
{{- if not (has .Values.mode (list "gateway" "sidecar")) -}}
{{- fail (printf "mode must be gateway or sidecar, not %v" .Values.mode) -}}
{{- end -}}
{{- if not .Values.broker -}}
{{- fail "broker is required: the brokers' URL, e.g. pulsar://pulsar-broker.pulsar.svc.cluster.local:6650" -}}
{{- end -}}
{{- if not (regexMatch "^pulsar(\\+ssl)?://" .Values.broker) -}}
{{- fail (printf "broker must start with pulsar:// or pulsar+ssl://, not %v" .Values.broker) -}}
{{- end -}}
{{- $reserved := list "broker" "workers" "listen" "listen-tls" "http-listen" "http-listen-tls" "broker-http" "tls-cert" "tls-key" "tls-client-ca" "broker-tls-ca" "broker-tls-cert" "broker-tls-key" "broker-tls-no-verify-hostname" "allow-broker" "trust-broker" "auth-mode" "auth-token-secret-key" "auth-token-public-key" "auth-token-role-claim" "auth-token-audience" "broker-auth-token-file" "forward-auth-data" "auth-oidc-issuers" "auth-oidc-audiences" "auth-oidc-role-claim" "broker-auth-oauth2-issuer" "broker-auth-oauth2-credentials" "broker-auth-oauth2-audience" "broker-auth-oauth2-scope" "drain-timeout" "record" "record-payloads" "record-ring" "snapshot-on" "record-retain-bytes" "record-retain-age" "record-lossless" "admin" "admin-token-file" "faults" "filters" "filter" "config" -}}
{{- $_ := include "sluice.config" . -}}
{{- range $key, $_ := .Values.config -}}
{{- if has (replace "_" "-" $key) $reserved -}}
{{- fail (printf "config.%s is set by the chart's own values (see values.yaml), not under config" $key) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.gateway.service.loadBalancerSourceRanges (ne .Values.gateway.service.type "LoadBalancer") -}}
{{- fail (printf "gateway.service.loadBalancerSourceRanges is for gateway.service.type LoadBalancer, not %s (the API refuses the Service)" .Values.gateway.service.type) -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) -}}
{{- fail "tls.enabled needs tls.secretName: a kubernetes.io/tls Secret" -}}
{{- end -}}
{{- if and (include "sluice.httpsPort" .) (not .Values.tls.secretName) -}}
{{- fail "http.tls.enabled needs tls.secretName: the kubernetes.io/tls Secret whose certificate the HTTPS listener serves (the binary TLS listener's too, with tls.enabled)" -}}
{{- end -}}
{{- if and (not .Values.listen.plain) (not .Values.tls.enabled) -}}
{{- fail "listen.plain false needs tls.enabled: Sluice would listen nowhere" -}}
{{- end -}}
{{- /* Each listener a port of its own: two on one port fail to bind at
start (the admin port, on the wildcard, takes a sidecar's 127.0.0.1 one
too), and the pods crash-loop. */ -}}
{{- $taken := dict (toString .Values.admin.port) "admin.port" -}}
{{- $own := list -}}
{{- if .Values.listen.plain }}{{ $own = append $own (list "listen.port" .Values.listen.port) }}{{ end -}}
{{- if .Values.tls.enabled }}{{ $own = append $own (list "tls.port" .Values.tls.port) }}{{ end -}}
{{- range $own -}}
{{- $port := toString (index . 1) -}}
{{- if hasKey $taken $port -}}
{{- fail (printf "%s %s is also %s: each of Sluice's listeners needs a port of its own" (index . 0) $port (get $taken $port)) -}}
{{- end -}}
{{- $_ := set $taken $port (index . 0) -}}
{{- end -}}
{{- with include "sluice.listenerPorts" . -}}
{{- $range := fromJsonArray . -}}
{{- if and (include "sluice.httpPlain" $) (not (hasKey $taken (toString $.Values.http.port))) -}}
{{- $_ := set $taken (toString $.Values.http.port) "http.port" -}}
{{- end -}}
{{- with include "sluice.httpsPort" $ -}}
{{- if not (hasKey $taken .) -}}
{{- $_ := set $taken . "http.tls.port" -}}
{{- end -}}
{{- end -}}
{{- range $port, $name := $taken -}}
{{- if and (ge (int $port) (int (index $range 0))) (le (int $port) (int (index $range 1))) -}}
{{- fail (printf "config.listener-ports %v-%v includes %s %s: the per-broker listeners need ports of their own (and the NetworkPolicy admits the range from anywhere)" (index $range 0) (index $range 1) $name $port) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.http.enabled -}}
{{- if not (regexMatch "^https?://" .Values.http.broker) -}}
{{- fail (printf "http.enabled needs http.broker: the brokers' web service, http://HOST:PORT or https://HOST:PORT (e.g. http://pulsar-broker.pulsar.svc.cluster.local:8080), not %q" .Values.http.broker) -}}
{{- end -}}
{{- if and (ne (toString .Values.workers) "1") (not (hasKey (include "sluice.config" . | fromJson) "listener-ports")) -}}
{{- fail "http.enabled with workers other than 1 needs config.listener-ports (LOW-HIGH): the ports Sluice opens per broker for HTTP lookups, bound by the supervisor and shared by the workers" -}}
{{- end -}}
{{- $_ := include "sluice.listenerPorts" . -}}
{{- $taken := list (int .Values.admin.port) (.Values.listen.plain | ternary (int .Values.listen.port) 0) (.Values.tls.enabled | ternary (int .Values.tls.port) 0) -}}
{{- if and (include "sluice.httpPlain" .) (has (int .Values.http.port) $taken) -}}
{{- fail (printf "http.port %v is taken by another of Sluice's listeners (listen.port, tls.port, admin.port)" .Values.http.port) -}}
{{- end -}}
{{- with include "sluice.httpsPort" . -}}
{{- if has (int .) (append $taken (eq (include "sluice.httpPlain" $) "true" | ternary (int $.Values.http.port) 0)) -}}
{{- fail (printf "http.tls.port %v is taken by another of Sluice's listeners (listen.port, tls.port, admin.port, http.port)" .) -}}
{{- end -}}
{{- else -}}
{{- if not (include "sluice.httpPlain" .) -}}
{{- fail "http.plain false needs http.tls.enabled: Sluice would have no web listener" -}}
{{- end -}}
{{- end -}}
{{- else if .Values.http.broker -}}
{{- fail "http.broker is for http.enabled: true" -}}
{{- else if dig "tls" "enabled" false .Values.http -}}
{{- fail "http.tls.enabled needs http.enabled and http.broker: the HTTPS listener relays to the brokers' web service as the HTTP one does" -}}
{{- end -}}
{{- if not (has .Values.auth.mode (list "passthrough" "proxy")) -}}
{{- fail (printf "auth.mode must be passthrough or proxy, not %v" .Values.auth.mode) -}}
{{- end -}}
{{- if eq .Values.auth.mode "proxy" -}}
{{- if not (or .Values.auth.tokenSecretKey.secretName .Values.auth.tokenPublicKey.secretName .Values.auth.tokenPublicKey.configMapName .Values.tls.clientCA.secretName .Values.auth.oidc.issuers) -}}
{{- fail "auth.mode proxy needs a way to check clients: auth.tokenSecretKey, auth.tokenPublicKey, auth.oidc.issuers or tls.clientCA" -}}
{{- end -}}
{{- if and .Values.auth.tokenSecretKey.secretName (or .Values.auth.tokenPublicKey.secretName .Values.auth.tokenPublicKey.configMapName) -}}
{{- fail "auth.tokenSecretKey or auth.tokenPublicKey: one key checks tokens (the brokers' tokenSecretKey or tokenPublicKey; Sluice refuses both)" -}}
{{- end -}}
{{- if and .Values.auth.tokenPublicKey.secretName .Values.auth.tokenPublicKey.configMapName -}}
{{- fail "auth.tokenPublicKey: give secretName or configMapName, not both" -}}
{{- end -}}
{{- if and .Values.auth.oidc.issuers (not .Values.auth.oidc.audiences) -}}
{{- fail "auth.oidc.issuers needs auth.oidc.audiences: a token must name Pulsar as its audience, as the brokers' openIDAllowedAudiences requires" -}}
{{- end -}}
{{- $oauth2 := .Values.auth.brokerOAuth2 -}}
{{- if ne (empty $oauth2.issuer) (empty $oauth2.credentialsSecret) -}}
{{- fail "auth.brokerOAuth2: issuer and credentialsSecret go together" -}}
{{- end -}}
{{- if and $oauth2.issuer (include "sluice.brokerTokenSecret" .) -}}
{{- fail "auth.brokerOAuth2 or auth.brokerToken: one own credential" -}}
{{- end -}}
{{- if not (or .Values.auth.brokerToken.secretName .Values.auth.brokerToken.value .Values.brokerTLS.clientCertSecretName $oauth2.issuer) -}}
{{- fail "auth.mode proxy needs Sluice's own credential: auth.brokerToken, auth.brokerOAuth2 or brokerTLS.clientCertSecretName" -}}
{{- end -}}
{{- else if or .Values.trustBroker .Values.auth.forwardAuthData .Values.auth.oidc.issuers .Values.auth.brokerOAuth2.issuer -}}
{{- fail "trustBroker, auth.forwardAuthData, auth.oidc and auth.brokerOAuth2 are for auth.mode proxy" -}}
{{- end -}}
{{- if ne .Values.auth.mode "proxy" -}}
{{- /* Sluice refuses such a filter at start (CrashLoopBackOff) and on
reload (the running pods keep the filters before): no client has a
verified role in passthrough, so it would run for nobody. */ -}}
{{- range $key, $_ := .Values.config -}}
{{- if eq (replace "_" "-" $key) "auth-oidc-ca" -}}
{{- fail (printf "config.%s is for auth.mode proxy (Sluice refuses it in passthrough)" $key) -}}
{{- end -}}
{{- end -}}
{{- range .Values.filters -}}
{{- if .roles -}}
{{- fail (printf "filters: %s names roles, which need auth.mode proxy (in passthrough no client has a verified role, and Sluice refuses the filter)" (.label | default .name | squote)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.admin.token.existingSecret .Values.admin.token.value -}}
{{- fail "admin.token: give existingSecret or value, not both" -}}
{{- end -}}
{{- if and .Values.auth.brokerToken.secretName .Values.auth.brokerToken.value -}}
{{- fail "auth.brokerToken: give secretName or value, not both" -}}
{{- end -}}
{{- $workers := include "sluice.workerCount" . | int64 -}}
{{- $drain := include "sluice.drainSeconds" . | int64 -}}
{{- if .Values.terminationGracePeriodSeconds -}}
{{- $pause := include "sluice.preStopSleep" . | int64 -}}
{{- if lt (.Values.terminationGracePeriodSeconds | int64) (add $pause $drain 5) -}}
{{- $shorter := "a shorter drainTimeout" -}}
{{- if eq .Values.mode "gateway" -}}
{{- $shorter = "a shorter gateway.preStopSleep or drainTimeout" -}}
{{- else if not .Values.sidecar.native -}}
{{- $shorter = "a shorter sidecar.preStopSleep (left unset, it shrinks to what the grace period leaves) or drainTimeout, sidecar.native: true (no pause)" -}}
{{- end -}}
{{- fail (printf "terminationGracePeriodSeconds %v must be at least the pre-stop pause + drainTimeout + 5 (%d + %d + 5 = %d): the grace period starts before the pause, and workers still running 5 s after the drain are killed; give %s, or a longer terminationGracePeriodSeconds" .Values.terminationGracePeriodSeconds $pause $drain (add $pause $drain 5) $shorter) -}}
{{- end -}}
{{- end -}}
{{- if include "sluice.recording" . -}}
{{- $retain := include "sluice.sizeBytes" .Values.recording.retainBytes | int64 -}}
{{- /* What Sluice refuses at start (sluice/commands/proxy.py): a size of
no byte, and a retention whose quarter share per worker cannot hold what a
writer may write between two passes (MIN_QUANTUM, 64Ki, in
sluice/recording/retention.py). */ -}}
{{- if lt $retain 1 -}}
{{- fail (printf "recording.retainBytes %v: a size must be positive" .Values.recording.retainBytes) -}}
{{- end -}}
{{- $least := mul 65536 4 $workers -}}
{{- if lt $retain $least -}}
{{- fail (printf "recording.retainBytes %v is too small for %d worker(s): each writes up to a quarter of its share between two retention passes and needs 64Ki; give at least %d" .Values.recording.retainBytes $workers $least) -}}
{{- end -}}
{{- $_ := include "sluice.recordingSize" . -}}
{{- if eq .Values.recording.mode "ring" -}}
{{- /* A ring given as a time (300s) is bounded in memory too: Sluice holds
it to 256 MiB a worker (RING_BYTES_WITH_SECONDS in
sluice/recording/writer.py) and checks that bound against the retention,
so the chart checks the same. */ -}}
{{- $timed := regexMatch "(?i)s$" (toString .Values.recording.ring) -}}
{{- $ring := 268435456 | int64 -}}
{{- if $timed -}}
{{- $seconds := regexReplaceAll "(?i)s$" (trim (toString .Values.recording.ring)) "" -}}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?$" $seconds) -}}
{{- fail (printf "recording.ring %v is not a time (e.g. 300s) or a size (e.g. 64M)" .Values.recording.ring) -}}
{{- end -}}
{{- if le (float64 $seconds) 0.0 -}}
{{- fail (printf "recording.ring %v: a time must be positive" .Values.recording.ring) -}}
{{- end -}}
{{- else -}}
{{- $ring = include "sluice.sizeBytes" .Values.recording.ring | int64 -}}
{{- if lt $ring 1 -}}
{{- fail (printf "recording.ring %v: a size must be positive" .Values.recording.ring) -}}
{{- end -}}
{{- end -}}
{{- if gt (mul $ring $workers 4) (mul $retain 3) -}}
{{- fail (printf "recording.ring %v%s per worker (%d workers%s) is more than three quarters of recording.retainBytes %v: the snapshots would not fit" .Values.recording.ring ($timed | ternary " (a time: up to 256Mi)" "") $workers (eq (toString .Values.workers) "auto" | ternary ", auto: ceil of the CPU limit" "") .Values.recording.retainBytes) -}}
{{- end -}}
{{- $resources := include "sluice.resources" . | fromJson -}}
{{- $limit := dig "limits" "memory" "" $resources -}}
{{- if $limit -}}
{{- $need := mul $workers (add $ring 67108864) -}}
{{- if lt (include "sluice.quantityBytes" $limit | int64) $need -}}
{{- fail (printf "the memory limit %v leaves no room for the ring: workers x (recording.ring + 64Mi) is %d bytes" $limit $need) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.recording.volume.persistent (eq .Values.mode "sidecar") (not .Values.recording.volume.existingClaim) -}}
{{- fail "recording.volume.persistent in sidecar mode needs recording.volume.existingClaim" -}}
{{- end -}}
{{- else if .Values.recording.snapshotOn -}}
{{- fail "recording.snapshotOn needs recording.mode ring" -}}
{{- end -}}
{{- end -}}

{{/* The preStop sleep before SIGTERM, in seconds (0: none). A gateway's
lets the Service's endpoints drop the pod first. A sidecar in the pod's
containers gets SIGTERM together with the application, and Sluice's drain
hands the connections back and exits at once, so the application's last
flush and reconnects would find nothing listening: its sleep keeps Sluice
serving while the application stops. A native sidecar is stopped only
after the application has exited: no sleep. Not set, a sidecar's is 10 s,
or what a terminationGracePeriodSeconds of the user's leaves after the
drain and its 5 s (down to none): a grace period that worked before the
sleep existed still does; a sleep the user asked for is checked as given. */}}
{{- define "sluice.preStopSleep" -}}
{{- if eq .Values.mode "gateway" -}}
{{- .Values.gateway.preStopSleep | int64 -}}
{{- else if .Values.sidecar.native -}}
0
{{- else if not (kindIs "invalid" .Values.sidecar.preStopSleep) -}}
{{- .Values.sidecar.preStopSleep | int64 -}}
{{- else if .Values.terminationGracePeriodSeconds -}}
{{- sub (.Values.terminationGracePeriodSeconds | int64) (add (include "sluice.drainSeconds" . | int64) 5) | max 0 | min 10 -}}
{{- else -}}
10
{{- end -}}
{{- end -}}

{{/* drainTimeout in whole seconds, rounded up (it may be 2.5): what the
grace period must cover. */}}
{{- define "sluice.drainSeconds" -}}
{{- .Values.drainTimeout | float64 | ceil | int64 -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: the value, or pause + drain + 10. The
kubelet counts the grace period from before the preStop hook. */}}
{{- define "sluice.gracePeriod" -}}
{{- $pause := include "sluice.preStopSleep" . | int64 -}}
{{- .Values.terminationGracePeriodSeconds | default (add $pause (include "sluice.drainSeconds" . | int64) 10) -}}
{{- end -}}

{{/* Where each mounted file lives in the container. */}}
{{- define "sluice.paths" -}}
config: /etc/sluice
adminToken: /etc/sluice-admin
tls: /etc/sluice-tls
clientCA: /etc/sluice-client-ca
brokerCA: /etc/sluice-broker-ca
brokerCert: /etc/sluice-broker-cert
tokenSecretKey: /etc/pulsar-token-secret
tokenPublicKey: /etc/pulsar-token-key
brokerToken: /etc/pulsar-credentials
brokerOAuth2: /etc/pulsar-oauth2
filterSecrets: /etc/sluice-filters
{{- end -}}

{{- define "sluice.adminTokenSecret" -}}
{{- if .Values.admin.token.existingSecret -}}
{{- .Values.admin.token.existingSecret -}}
{{- else if .Values.admin.token.value -}}
{{- include "sluice.suffixed" (list . "-admin") -}}
{{- end -}}
{{- end -}}

{{- define "sluice.brokerTokenSecret" -}}
{{- if .Values.auth.brokerToken.secretName -}}
{{- .Values.auth.brokerToken.secretName -}}
{{- else if .Values.auth.brokerToken.value -}}
{{- include "sluice.suffixed" (list . "-credentials") -}}
{{- end -}}
{{- end -}}

{{/* The settings of sluice.toml, as JSON: every setting the chart writes,
then config. They are written with toJson: a JSON string, number, boolean
or list of strings is also TOML. */}}
{{- define "sluice.settings" -}}
{{- $p := include "sluice.paths" . | fromYaml -}}
{{- $s := dict "broker" .Values.broker "drain-timeout" .Values.drainTimeout -}}
{{- /* Start while the broker cannot be reached yet (an outage, DNS not there
yet): /readyz stays 503 until it answers, where a refusal to start would be
CrashLoopBackOff (and a native sidecar would hold the application back).
config.no-check-broker: false restores the check. */ -}}
{{- $config := include "sluice.config" . | fromJson -}}
{{- if not (hasKey $config "no-check-broker") -}}
{{- $_ := set $s "no-check-broker" true -}}
{{- end -}}
{{- if eq (toString .Values.workers) "auto" -}}
{{- $_ := set $s "workers" "auto" -}}
{{- else if ne (include "sluice.workerCount" .) "1" -}}
{{- $_ := set $s "workers" (include "sluice.workerCount" . | int) -}}
{{- end -}}
{{- with .Values.allowBroker }}{{ $_ := set $s "allow-broker" . }}{{ end -}}
{{- if .Values.http.enabled }}{{ $_ := set $s "broker-http" .Values.http.broker }}{{ end -}}
{{- with .Values.trustBroker }}{{ $_ := set $s "trust-broker" . }}{{ end -}}
{{- if include "sluice.serverCert" . -}}
{{- $_ := set $s "tls-cert" (printf "%s/tls.crt" $p.tls) -}}
{{- $_ := set $s "tls-key" (printf "%s/tls.key" $p.tls) -}}
{{- end -}}
{{- with .Values.tls.clientCA.secretName -}}
{{- $_ := set $s "tls-client-ca" (printf "%s/%s" $p.clientCA $.Values.tls.clientCA.key) -}}
{{- end -}}
{{- with .Values.brokerTLS.ca.secretName -}}
{{- $_ := set $s "broker-tls-ca" (printf "%s/%s" $p.brokerCA $.Values.brokerTLS.ca.key) -}}
{{- end -}}
{{- if .Values.brokerTLS.clientCertSecretName -}}
{{- $_ := set $s "broker-tls-cert" (printf "%s/tls.crt" $p.brokerCert) -}}
{{- $_ := set $s "broker-tls-key" (printf "%s/tls.key" $p.brokerCert) -}}
{{- end -}}
{{- if not .Values.brokerTLS.verifyHostname -}}
{{- $_ := set $s "broker-tls-no-verify-hostname" true -}}
{{- end -}}
{{- if eq .Values.auth.mode "proxy" -}}
{{- $_ := set $s "auth-mode" "proxy" -}}
{{- with .Values.auth.tokenSecretKey.secretName -}}
{{- $_ := set $s "auth-token-secret-key" (printf "%s/%s" $p.tokenSecretKey $.Values.auth.tokenSecretKey.key) -}}
{{- end -}}
{{- if or .Values.auth.tokenPublicKey.secretName .Values.auth.tokenPublicKey.configMapName -}}
{{- $_ := set $s "auth-token-public-key" (printf "%s/%s" $p.tokenPublicKey .Values.auth.tokenPublicKey.key) -}}
{{- end -}}
{{- with .Values.auth.roleClaim }}{{ $_ := set $s "auth-token-role-claim" . }}{{ end -}}
{{- with .Values.auth.audience }}{{ $_ := set $s "auth-token-audience" . }}{{ end -}}
{{- if include "sluice.brokerTokenSecret" . -}}
{{- $_ := set $s "broker-auth-token-file" (printf "%s/%s" $p.brokerToken (empty .Values.auth.brokerToken.secretName | ternary "token" .Values.auth.brokerToken.key)) -}}
{{- end -}}
{{- if .Values.auth.forwardAuthData }}{{ $_ := set $s "forward-auth-data" true }}{{ end -}}
{{- with .Values.auth.oidc.issuers }}{{ $_ := set $s "auth-oidc-issuers" (join "," .) }}{{ end -}}
{{- with .Values.auth.oidc.audiences }}{{ $_ := set $s "auth-oidc-audiences" (join "," .) }}{{ end -}}
{{- with .Values.auth.oidc.roleClaim }}{{ $_ := set $s "auth-oidc-role-claim" . }}{{ end -}}
{{- with .Values.auth.brokerOAuth2 -}}
{{- if .issuer -}}
{{- $_ := set $s "broker-auth-oauth2-issuer" .issuer -}}
{{- $_ := set $s "broker-auth-oauth2-credentials" (printf "%s/%s" $p.brokerOAuth2 .key) -}}
{{- with .audience }}{{ $_ := set $s "broker-auth-oauth2-audience" . }}{{ end -}}
{{- with .scope }}{{ $_ := set $s "broker-auth-oauth2-scope" . }}{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if include "sluice.adminTokenSecret" . -}}
{{- $_ := set $s "admin-token-file" (printf "%s/%s" $p.adminToken (empty .Values.admin.token.existingSecret | ternary "token" .Values.admin.token.key)) -}}
{{- end -}}
{{- if include "sluice.recording" . -}}
{{- $r := .Values.recording -}}
{{- $_ := set $s "record" $r.volume.mountPath -}}
{{- $_ := set $s "record-payloads" $r.payloads -}}
{{- $_ := set $s "record-retain-bytes" (toString $r.retainBytes) -}}
{{- with $r.retainAge }}{{ $_ := set $s "record-retain-age" . }}{{ end -}}
{{- if $r.lossless }}{{ $_ := set $s "record-lossless" true }}{{ end -}}
{{- if eq $r.mode "ring" -}}
{{- $_ := set $s "record-ring" (toString $r.ring) -}}
{{- with $r.snapshotOn -}}
{{- if kindIs "string" . -}}
{{- $_ := set $s "snapshot-on" . -}}
{{- else -}}
{{- range . -}}
{{- if hasKey . "true" -}}
{{- fail "recording.snapshotOn: a rule has the key true: quote \"on\" (YAML reads a bare on as true)" -}}
{{- end -}}
{{- end -}}
{{- $_ := set $s "snapshot-on" (toJson .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.faults -}}
{{- $_ := set $s "faults" (printf "%s/faults.json" $p.config) -}}
{{- end -}}
{{- $s = merge $s $config -}}
{{- toJson $s -}}
{{- end -}}

{{/* The settings Sluice puts in force when the mounted sluice.toml changes
(`sluice proxy` reloads it: the fields of sluice/proxy/reload.py's LIVE, as
flags, and snapshot-on; tests/test_helm.py holds the two lists equal). A
change to any other setting needs a restart: the pod template carries the
checksum of those ("sluice.restartChecksum"), so it rolls the pods; a
change to these alone (and to the filters and fault rules) reaches the
running pods when the kubelet updates the ConfigMap. */}}
{{- define "sluice.liveSettings" -}}
{{- list "allow-broker" "trust-broker" "faults" "max-connections" "max-connections-per-ip" "http-max-connections" "max-concurrent-lookups" "max-upstream-connections" "max-redirects" "auth-mode" "auth-token-secret-key" "auth-token-public-key" "auth-token-role-claim" "auth-token-audience" "broker-auth-token-file" "forward-auth-data" "auth-oidc-issuers" "auth-oidc-audiences" "auth-oidc-role-claim" "auth-oidc-leeway" "auth-oidc-allow-http" "auth-oidc-refresh" "auth-oidc-miss-refresh" "auth-oidc-ca" "broker-auth-oauth2-issuer" "broker-auth-oauth2-credentials" "broker-auth-oauth2-audience" "broker-auth-oauth2-scope" "filters" "tls-cert" "tls-key" "tls-client-ca" "broker-tls-ca" "broker-tls-cert" "broker-tls-key" "broker-tls-no-verify-hostname" "snapshot-on" | toJson -}}
{{- end -}}

{{- define "sluice.restartChecksum" -}}
{{- $s := include "sluice.settings" . | fromJson -}}
{{- range include "sluice.liveSettings" . | fromJsonArray -}}
{{- $_ := unset $s . -}}
{{- end -}}
{{- /* The admin token is read at start only: the settings name its file,
not its content, so the checksum also covers the token of the Secret the
chart makes (its hash) and admin.token.rotation (for an existing Secret,
whose content the chart cannot see). */ -}}
{{- if include "sluice.adminTokenSecret" . -}}
{{- $token := .Values.admin.token -}}
{{- $_ := set $s "admin-token" (dict "value" ($token.value | sha256sum) "rotation" (toString ($token.rotation | default ""))) -}}
{{- end -}}
{{- toJson $s | sha256sum -}}
{{- end -}}

{{- define "sluice.toml" -}}
{{- $s := include "sluice.settings" . | fromJson -}}
# Written by the sluice Helm chart from its values; `sluice proxy --help`
# and docs/proxy.md say what each setting does.
[proxy]
{{- range $key := keys $s | sortAlpha }}
{{ $key }} = {{ get $s $key | toJson }}
{{- end }}
{{- range .Values.filters }}

[[proxy.filters]]
{{- $filter := . }}
{{- range $key := keys . | sortAlpha }}
{{ $key | toJson }} = {{ include "sluice.tomlValue" (get $filter $key) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A value as TOML: tables inline, lists, and the rest as JSON writes
them (strings, numbers and booleans read the same in TOML). */}}
{{- define "sluice.tomlValue" -}}
{{- if kindIs "map" . -}}
{ {{- range $i, $k := keys . | sortAlpha }}{{ if $i }}, {{ end }}{{ $k | toJson }} = {{ include "sluice.tomlValue" (get $ $k) }}{{ end -}} }
{{- else if kindIs "slice" . -}}
[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "sluice.tomlValue" $v }}{{ end }}]
{{- else -}}
{{- toJson . -}}
{{- end -}}
{{- end -}}

{{/* config as JSON, each name as `sluice proxy --help` writes it: a
--config file takes max_connections for max-connections too
(sluice/config.py load_file), and so does config. Both spellings of one
setting: refused, as one would silently win over the other. */}}
{{- define "sluice.config" -}}
{{- $config := dict -}}
{{- range $key, $value := .Values.config -}}
{{- $name := replace "_" "-" $key -}}
{{- if hasKey $config $name -}}
{{- fail (printf "config.%s and config.%s are one setting: give one" $name $key) -}}
{{- end -}}
{{- $_ := set $config $name $value -}}
{{- end -}}
{{- toJson $config -}}
{{- end -}}

{{/* config.listener-ports as JSON [LOW, HIGH] ("" when not set): the
per-broker listeners' ports (sluice/commands/proxy.py port_range). */}}
{{- define "sluice.listenerPorts" -}}
{{- with (get (include "sluice.config" . | fromJson) "listener-ports") -}}
{{- $text := toString . -}}
{{- if not (regexMatch "^[0-9]+(-[0-9]+)?$" $text) -}}
{{- fail (printf "config.listener-ports %q: expected LOW-HIGH, e.g. 7000-7099" $text) -}}
{{- end -}}
{{- $low := regexFind "^[0-9]+" $text | int -}}
{{- $high := regexFind "[0-9]+$" $text | int -}}
{{- if or (lt $low 1) (gt $high 65535) (gt $low $high) -}}
{{- fail (printf "config.listener-ports %q: expected LOW-HIGH with 1 <= LOW <= HIGH <= 65535" $text) -}}
{{- end -}}
{{- list $low $high | toJson -}}
{{- end -}}
{{- end -}}

{{/* "true" when the plain HTTP listener (--http-listen) is on: http.enabled
and http.plain not false (unset, a release upgraded with --reuse-values
from a chart without it: on, as before it existed). */}}
{{- define "sluice.httpPlain" -}}
{{- if and .Values.http.enabled (ne (toString (dig "plain" true .Values.http)) "false") -}}
true
{{- end -}}
{{- end -}}

{{/* The HTTPS listener's port (--http-listen-tls), "" when off: http.enabled
and http.tls.enabled (unset with --reuse-values from an older chart: off). */}}
{{- define "sluice.httpsPort" -}}
{{- if and .Values.http.enabled (dig "tls" "enabled" false .Values.http) -}}
{{- dig "tls" "port" 8443 .Values.http | int -}}
{{- end -}}
{{- end -}}

{{/* "true" when a listener serves the certificate of tls.secretName: the
binary TLS listener (tls.enabled), the HTTPS one (http.tls.enabled), or
both. */}}
{{- define "sluice.serverCert" -}}
{{- if or .Values.tls.enabled (include "sluice.httpsPort" .) -}}
true
{{- end -}}
{{- end -}}

{{/* bindAddress as a listener's host: an IPv6 address in brackets. */}}
{{- define "sluice.bindHost" -}}
{{- /* Unset (a release upgraded with --reuse-values from a chart without
it, or bindAddress: null): IPv4, as before it existed. */ -}}
{{- $address := .Values.bindAddress | default "0.0.0.0" | toString -}}
{{- contains ":" $address | ternary (printf "[%s]" $address) $address -}}
{{- end -}}

{{/* The container's environment: where it listens. */}}
{{- define "sluice.env" -}}
{{- $bind := include "sluice.bindHost" . -}}
{{- $host := eq .Values.mode "sidecar" | ternary "127.0.0.1" $bind -}}
- name: SLUICE_LISTEN
  value: {{ .Values.listen.plain | ternary (printf "%s:%v" $host .Values.listen.port) "none" | quote }}
{{- if .Values.tls.enabled }}
- name: SLUICE_LISTEN_TLS
  value: {{ printf "%s:%v" $host .Values.tls.port | quote }}
{{- end }}
{{- if .Values.http.enabled }}
{{- if include "sluice.httpPlain" . }}
- name: SLUICE_HTTP_LISTEN
  value: {{ printf "%s:%v" $host .Values.http.port | quote }}
{{- end }}
{{- with include "sluice.httpsPort" . }}
# HTTPS (http.tls), with the certificate of tls.secretName.
- name: SLUICE_HTTP_LISTEN_TLS
  value: {{ printf "%s:%v" $host . | quote }}
{{- end }}
{{- if and (eq .Values.mode "gateway") (not (hasKey (include "sluice.config" . | fromJson) "advertise-host")) }}
# HTTP lookups name a listener of this pod (config.listener-ports) for the
# client to dial: on the pod's IP, which every pod of the cluster reaches
# (the pod's host name does not resolve for them).
- name: SLUICE_ADVERTISE_HOST
  valueFrom:
    fieldRef: {fieldPath: status.podIP}
{{- end }}
{{- end }}
# The kubelet's probes and Prometheus reach the admin endpoint on the pod's
# IP; changes there need the admin token.
- name: SLUICE_ADMIN
  value: {{ printf "%s:%v" $bind .Values.admin.port | quote }}
{{- end -}}

{{/* The volumes the container mounts (names prefixed, so that they sit
beside an application's own). */}}
{{- define "sluice.volumes" -}}
{{- $name := include "sluice.fullname" . -}}
- name: sluice-config
  configMap:
    name: {{ $name }}
- name: sluice-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- with include "sluice.adminTokenSecret" . }}
- name: sluice-admin-token
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- if include "sluice.serverCert" . }}
- name: sluice-tls
  secret:
    secretName: {{ .Values.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- with .Values.tls.clientCA.secretName }}
- name: sluice-client-ca
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- with .Values.brokerTLS.ca.secretName }}
- name: sluice-broker-ca
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- with .Values.brokerTLS.clientCertSecretName }}
- name: sluice-broker-cert
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- if eq .Values.auth.mode "proxy" }}
{{- with .Values.auth.tokenSecretKey.secretName }}
- name: sluice-token-secret-key
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- if .Values.auth.tokenPublicKey.secretName }}
- name: sluice-token-public-key
  secret:
    secretName: {{ .Values.auth.tokenPublicKey.secretName }}
    defaultMode: 0440
{{- else if .Values.auth.tokenPublicKey.configMapName }}
# The public key the brokers' tokenPublicKey names (not a secret).
- name: sluice-token-public-key
  configMap:
    name: {{ .Values.auth.tokenPublicKey.configMapName }}
{{- end }}
{{- with include "sluice.brokerTokenSecret" . }}
- name: sluice-broker-token
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- with .Values.auth.brokerOAuth2.credentialsSecret }}
- name: sluice-broker-oauth2
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- end }}
{{- range .Values.filterSecrets }}
- name: sluice-filter-{{ .name }}
  secret:
    secretName: {{ .secretName }}
    defaultMode: 0440
{{- end }}
{{- if include "sluice.recording" . }}
{{- if .Values.recording.volume.persistent }}
{{- if eq .Values.mode "sidecar" }}
- name: sluice-recordings
  persistentVolumeClaim:
    claimName: {{ .Values.recording.volume.existingClaim }}
{{- end }}
{{- else }}
# Holds at most recording.retainBytes ({{ .Values.recording.retainBytes }}).
- name: sluice-recordings
  emptyDir:
    sizeLimit: {{ include "sluice.recordingSize" . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The container: what the gateway's pods and an application's pods run. */}}
{{- define "sluice.container" -}}
{{- include "sluice.validate" . -}}
{{- $p := include "sluice.paths" . | fromYaml -}}
{{- $sidecar := eq .Values.mode "sidecar" -}}
- name: sluice
  image: {{ include "sluice.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["proxy", "--config", "{{ $p.config }}/sluice.toml"]
  {{- if and $sidecar .Values.sidecar.native }}
  # A native sidecar: in the pod's initContainers, up before the application
  # and stopped after it.
  restartPolicy: Always
  {{- end }}
  env:
    {{- include "sluice.env" . | nindent 4 }}
  ports:
    {{- if and .Values.listen.plain (not $sidecar) }}
    - {name: pulsar, containerPort: {{ .Values.listen.port }}, protocol: TCP}
    {{- end }}
    {{- if and .Values.tls.enabled (not $sidecar) }}
    - {name: pulsar-tls, containerPort: {{ .Values.tls.port }}, protocol: TCP}
    {{- end }}
    {{- if and (include "sluice.httpPlain" .) (not $sidecar) }}
    - {name: http, containerPort: {{ .Values.http.port }}, protocol: TCP}
    {{- end }}
    {{- with and (not $sidecar) (include "sluice.httpsPort" .) }}
    - {name: https, containerPort: {{ . }}, protocol: TCP}
    {{- end }}
    - {name: sluice-admin, containerPort: {{ .Values.admin.port }}, protocol: TCP}
  livenessProbe:
    httpGet: {path: /healthz, port: sluice-admin}
    {{- toYaml .Values.probes.liveness | nindent 4 }}
  readinessProbe:
    {{- $follows := .Values.probes.readinessFollowsBroker }}
    {{- if kindIs "invalid" $follows }}{{ $follows = not $sidecar }}{{ end }}
    httpGet: {path: {{ $follows | ternary "/readyz" "/readyz?exclude=upstream" | quote }}, port: sluice-admin}
    {{- toYaml .Values.probes.readiness | nindent 4 }}
  {{- if and $sidecar .Values.sidecar.native }}
  # The application's containers start once this passes: once Sluice
  # listens (a native sidecar counts as started when its startupProbe does).
  startupProbe:
    httpGet: {path: "/readyz?exclude=upstream", port: sluice-admin}
    {{- toYaml .Values.probes.startup | nindent 4 }}
  {{- end }}
  {{- with include "sluice.preStopSleep" . | int }}
  lifecycle:
    {{- if $sidecar }}
    # Keep serving while the application, stopped at the same time, shuts
    # down (its last sends, its reconnects); then SIGTERM starts the drain.
    {{- else }}
    # Leave the Service's endpoints before SIGTERM starts the drain.
    {{- end }}
    preStop:
      sleep: {seconds: {{ . }}}
  {{- end }}
  resources:
    {{- toYaml ($sidecar | ternary .Values.sidecar.resources .Values.gateway.resources) | nindent 4 }}
  {{- $context := deepCopy .Values.securityContext }}
  {{- if and $sidecar .Values.podSecurityContext.seccompProfile (not (hasKey $context "seccompProfile")) }}
  {{- /* The pod's securityContext is the application's (the include gives
  it fsGroup only): podSecurityContext's seccomp profile goes on the
  container, as the restricted Pod Security Standard wants it somewhere. */}}
  {{- $_ := set $context "seccompProfile" .Values.podSecurityContext.seccompProfile }}
  {{- end }}
  {{- if and $sidecar (not (hasKey $context "runAsGroup")) }}
  {{- /* Written once: a runAsGroup of securityContext's own is kept. */}}
  {{- $_ := set $context "runAsGroup" .Values.podSecurityContext.fsGroup }}
  # runAsGroup: the group the pod's fsGroup gives the mounted Secrets.
  {{- end }}
  securityContext:
    {{- toYaml $context | nindent 4 }}
  volumeMounts:
    - {name: sluice-config, mountPath: {{ $p.config }}, readOnly: true}
    - {name: sluice-tmp, mountPath: /tmp}
    {{- if include "sluice.adminTokenSecret" . }}
    - {name: sluice-admin-token, mountPath: {{ $p.adminToken }}, readOnly: true}
    {{- end }}
    {{- if include "sluice.serverCert" . }}
    - {name: sluice-tls, mountPath: {{ $p.tls }}, readOnly: true}
    {{- end }}
    {{- if .Values.tls.clientCA.secretName }}
    - {name: sluice-client-ca, mountPath: {{ $p.clientCA }}, readOnly: true}
    {{- end }}
    {{- if .Values.brokerTLS.ca.secretName }}
    - {name: sluice-broker-ca, mountPath: {{ $p.brokerCA }}, readOnly: true}
    {{- end }}
    {{- if .Values.brokerTLS.clientCertSecretName }}
    - {name: sluice-broker-cert, mountPath: {{ $p.brokerCert }}, readOnly: true}
    {{- end }}
    {{- if eq .Values.auth.mode "proxy" }}
    {{- if .Values.auth.tokenSecretKey.secretName }}
    - {name: sluice-token-secret-key, mountPath: {{ $p.tokenSecretKey }}, readOnly: true}
    {{- end }}
    {{- if or .Values.auth.tokenPublicKey.secretName .Values.auth.tokenPublicKey.configMapName }}
    - {name: sluice-token-public-key, mountPath: {{ $p.tokenPublicKey }}, readOnly: true}
    {{- end }}
    {{- if include "sluice.brokerTokenSecret" . }}
    - {name: sluice-broker-token, mountPath: {{ $p.brokerToken }}, readOnly: true}
    {{- end }}
    {{- if .Values.auth.brokerOAuth2.credentialsSecret }}
    - {name: sluice-broker-oauth2, mountPath: {{ $p.brokerOAuth2 }}, readOnly: true}
    {{- end }}
    {{- end }}
    {{- range .Values.filterSecrets }}
    - {name: sluice-filter-{{ .name }}, mountPath: {{ $p.filterSecrets }}/{{ .name }}, readOnly: true}
    {{- end }}
    {{- if include "sluice.recording" . }}
    - {name: sluice-recordings, mountPath: {{ .Values.recording.volume.mountPath }}}
    {{- end }}
{{- end -}}

{{/* The pod annotations: Prometheus' scrape annotations, and the checksum
of the settings that need a restart, so that pods restart when one of them
changes (the others are reloaded in place: "sluice.liveSettings"). */}}
{{- define "sluice.podAnnotations" -}}
{{- /* A pod has one set of scrape annotations: a sidecar's application may
keep its own (sidecar.scrapeAnnotations: false; Sluice is then scraped
through the ServiceMonitor). */ -}}
{{- if or (eq .Values.mode "gateway") (ne (toString .Values.sidecar.scrapeAnnotations) "false") -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.admin.port | quote }}
prometheus.io/path: /metrics
{{ end -}}
checksum/sluice-restart-settings: {{ include "sluice.restartChecksum" . }}
{{- end -}}

{{/* The ConfigMap's data. */}}
{{- define "sluice.configData" -}}
sluice.toml: |
  {{- include "sluice.toml" . | nindent 2 }}
{{- with .Values.faults }}
faults.json: |
  {{- toPrettyJson . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "sluice.serviceAccount" -}}
{{- if .Values.gateway.serviceAccount.create -}}
{{- default (include "sluice.fullname" .) .Values.gateway.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.gateway.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Whether to make a Prometheus Operator object: "auto" when the cluster
serves monitoring.coreos.com/v1 KIND, or the value itself. */}}
{{- define "sluice.operator" -}}
{{- $enabled := index . 0 -}}
{{- $root := index . 1 -}}
{{- $kind := index . 2 -}}
{{- if eq (toString $enabled) "auto" -}}
{{- $root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind) | ternary "true" "" -}}
{{- else if $enabled -}}
true
{{- end -}}
{{- end -}}
