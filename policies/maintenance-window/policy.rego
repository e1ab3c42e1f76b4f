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

tz_of(w) := object.get(w, "timezone", default_timezone)

# The clock in every zone a window is written in, computed once per decision:
# today's and yesterday's weekday (three letters, lower case) and minutes since midnight.
local[tz] := {"today": today, "yesterday": yesterday, "minutes": (h * 60) + m} if {
	some w in windows
	tz := tz_of(w)
	[h, m, _] := time.clock([now_ns, tz])
	today := lower(substring(time.weekday([now_ns, tz]), 0, 3))
	yesterday := lower(substring(time.weekday([now_ns - day_ns, tz]), 0, 3))
}

# Each window with its times parsed and its days normalised.
spans contains {"start": minutes(w.start), "end": minutes(w.end), "days": {lower(substring(d, 0, 3)) | some d in w.days}, "clock": local[tz_of(w)]} if {
	some w in windows
}

# Same-day window: start <= now < end on an opening day.
open(s) if {
	s.start < s.end
	s.clock.today in s.days
	s.start <= s.clock.minutes
	s.clock.minutes < s.end
}

# Window crossing midnight, evening part: opened today.
open(s) if {
	s.start >= s.end
	s.clock.today in s.days
	s.clock.minutes >= s.start
}

# Window crossing midnight, morning part: opened yesterday.
open(s) if {
	s.start >= s.end
	s.clock.yesterday in s.days
	s.clock.minutes < s.end
}

any_open if {
	some s in spans
	open(s)
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
