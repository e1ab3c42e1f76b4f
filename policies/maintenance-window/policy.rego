# Maintenance windows: a node's work may start only while a window is open. A node under
# way when a window closes finishes; the next one waits for the next window. Asked by the
# controller before each node's task starts (the operation decision point with
# input.nextNode), for every kind of Operation: upgrades, renewals, reboots, custom work. A
# held node's task stays Pending and starts on its own once a window opens.
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
# With no windows configured at all, every node is held: the policy was asked for.
#
# Before planning (no input.nextNode) nothing is decided: the plan may be made any time.
#
# Written to be cheap to evaluate: times are compared as HHMM numbers (22:00 is 2200), each
# window's clock is read once, and there are few rules.
package bosun.operation.maintenance_window

# The node about to start, from the summaries of the planned nodes.
next_node := n if {
	some n in input.nodes
	n.name == input.nextNode
}

windows := ws if {
	ws := json.unmarshal(next_node.annotations["bosun.dev/maintenance-windows"])
	ws
} else := ws if {
	ws := data.maintenance_windows.windows
} else := []

default_timezone := tz if {
	tz := data.maintenance_windows.timezone
} else := "UTC"

# The indexes of the windows open at input.now.
open_windows contains i if {
	now_ns := time.parse_rfc3339_ns(input.now)
	some i, w in windows
	tz := object.get(w, "timezone", default_timezone)
	[h, m, _] := time.clock([now_ns, tz])

	# "HH:MM" as the number HHMM: to_number refuses a leading zero ("0400" is not a JSON
	# number), so parse "10400" and take the 10000 back off. Not a number: evaluation fails.
	start := to_number(concat("", ["1", replace(w.start, ":", "")])) - 10000
	end := to_number(concat("", ["1", replace(w.end, ":", "")])) - 10000
	days_ago := opened_days_ago(start, end, (h * 100) + m)

	# The window is open when it opened (today or yesterday) on one of its days.
	day := lower(substring(time.weekday([now_ns - (days_ago * 86400000000000), tz]), 0, 3)) # 24 h in ns
	some d in w.days
	lower(substring(d, 0, 3)) == day
}

# When a window open now opened: 0 (today) or 1 (yesterday). Undefined when it is closed.
# Same-day window: open from start until end.
opened_days_ago(start, end, now) := 0 if {
	start < end
	start <= now
	now < end
}

# Window crossing midnight, evening part: opened today.
opened_days_ago(start, end, now) := 0 if {
	start >= end
	now >= start
}

# Window crossing midnight, morning part: opened yesterday.
opened_days_ago(start, end, now) := 1 if {
	start >= end
	now < end
}

deny contains msg if {
	is_string(input.nextNode)
	count(windows) == 0
	msg := sprintf("no maintenance windows are configured (data.maintenance_windows.windows is empty), so no node may start: node %s waits", [input.nextNode])
}

deny contains msg if {
	is_string(input.nextNode)
	count(windows) > 0
	count(open_windows) == 0
	described := [sprintf("%s %s-%s %s", [concat(",", w.days), w.start, w.end, object.get(w, "timezone", default_timezone)]) | some w in windows]
	# No time in the message: the controller asks on every pass while the node waits, and
	# a message that changes each time would be a new Event each time.
	msg := sprintf(
		"no maintenance window is open; node %s waits for the next one: %s",
		[input.nextNode, concat("; ", described)],
	)
}
