# Maintenance windows: a step may start only while a window is open.
#
# data.maintenance_windows:
#   timezone: IANA zone the windows are written in (default "UTC")
#   windows:  list of {days, start, end[, timezone]}
#     days:  weekdays the window OPENS on ("Sat", "Saturday", "sat" ...)
#     start, end: "HH:MM" local time; end <= start means the window runs past midnight
#                 into the next day (Sat 22:00-04:00 is open Saturday night until Sunday 04:00)
#
# A node can be given its own windows with the annotation bosun.dev/maintenance-windows
# (the same JSON list); they replace the cluster-wide ones for that node.
# With no windows configured at all, every step is denied: the policy was asked for.
package bosun.step.maintenance_window

default config := {}

config := data.maintenance_windows

default_timezone := object.get(config, "timezone", "UTC")

node_windows := json.unmarshal(input.node.annotations["bosun.dev/maintenance-windows"])

windows := node_windows if {
	node_windows
} else := object.get(config, "windows", [])

now_ns := time.parse_rfc3339_ns(input.now)

day_ns := ((24 * 60) * 60) * 1000000000

minutes(hhmm) := m if {
	parts := split(hhmm, ":")
	count(parts) == 2
	# to_number refuses a leading zero ("04" is not a JSON number): parse "104" and
	# take the 100 back off.
	m := ((to_number(concat("", ["1", parts[0]])) - 100) * 60) + (to_number(concat("", ["1", parts[1]])) - 100)
}

opens_on(w, weekday) if {
	some d in w.days
	lower(substring(d, 0, 3)) == lower(substring(weekday, 0, 3))
}

local_minutes(tz) := m if {
	[h, mi, _] := time.clock([now_ns, tz])
	m := (h * 60) + mi
}

tz_of(w) := object.get(w, "timezone", default_timezone)

# Same-day window: start <= now < end on an opening day.
open(w) if {
	minutes(w.start) < minutes(w.end)
	opens_on(w, time.weekday([now_ns, tz_of(w)]))
	minutes(w.start) <= local_minutes(tz_of(w))
	local_minutes(tz_of(w)) < minutes(w.end)
}

# Window crossing midnight, evening part: opened today.
open(w) if {
	minutes(w.start) >= minutes(w.end)
	opens_on(w, time.weekday([now_ns, tz_of(w)]))
	local_minutes(tz_of(w)) >= minutes(w.start)
}

# Window crossing midnight, morning part: opened yesterday.
open(w) if {
	minutes(w.start) >= minutes(w.end)
	opens_on(w, time.weekday([now_ns - day_ns, tz_of(w)]))
	local_minutes(tz_of(w)) < minutes(w.end)
}

any_open if {
	some w in windows
	open(w)
}

describe(w) := sprintf("%s %s-%s %s", [concat(",", w.days), w.start, w.end, tz_of(w)])

deny contains msg if {
	count(windows) == 0
	msg := "no maintenance windows are configured (data.maintenance_windows.windows is empty), so no step may start"
}

deny contains msg if {
	count(windows) > 0
	not any_open
	msg := sprintf(
		"no maintenance window is open at %s; steps on %s may start only in: %s",
		[input.now, input.node.name, concat("; ", [describe(w) | some w in windows])],
	)
}
