package bosun.operation.maintenance_window_test

import data.bosun.operation.maintenance_window

berlin_weekend := {"timezone": "Europe/Berlin", "windows": [{"days": ["Sat"], "start": "22:00", "end": "04:00"}]}

at(now) := {"now": now, "nextNode": "cp-1", "nodes": [{"name": "cp-1", "roles": ["control-plane"], "ready": true}]}

# 23:30 Berlin on Saturday 2026-11-28 (CET, UTC+1).
test_open_saturday_evening if {
	count(maintenance_window.deny) == 0 with input as at("2026-11-28T22:30:00Z")
		with data.maintenance_windows as berlin_weekend
}

# 03:59 Berlin on Sunday: the Saturday window is still open after midnight.
test_open_after_midnight if {
	count(maintenance_window.deny) == 0 with input as at("2026-11-29T02:59:00Z")
		with data.maintenance_windows as berlin_weekend
}

# 04:00 Berlin on Sunday: closed (end is exclusive).
test_closed_at_end if {
	count(maintenance_window.deny) == 1 with input as at("2026-11-29T03:00:00Z")
		with data.maintenance_windows as berlin_weekend
}

# 21:30 UTC on Saturday is 22:30 in Berlin but only 21:30 in UTC: the zone matters.
test_time_zone_shifts_the_window if {
	count(maintenance_window.deny) == 0 with input as at("2026-11-28T21:30:00Z")
		with data.maintenance_windows as berlin_weekend
	count(maintenance_window.deny) == 1 with input as at("2026-11-28T21:30:00Z")
		with data.maintenance_windows as {"windows": [{"days": ["Sat"], "start": "22:00", "end": "04:00"}]}
}

# Summer time: 22:30 Berlin on Saturday 2026-07-04 is 20:30 UTC (CEST, UTC+2).
test_daylight_saving_time if {
	count(maintenance_window.deny) == 0 with input as at("2026-07-04T20:30:00Z")
		with data.maintenance_windows as berlin_weekend
}

test_friday_night_is_not_saturday if {
	count(maintenance_window.deny) == 1 with input as at("2026-11-27T22:30:00Z")
		with data.maintenance_windows as berlin_weekend
}

test_no_windows_denies if {
	maintenance_window.deny == {"no maintenance windows are configured (data.maintenance_windows.windows is empty), so no node may start: node cp-1 waits"} with input as at("2026-11-28T22:30:00Z")
		with data.maintenance_windows as {"windows": []}
}

# A same-day window: open from start (inclusive) until end (exclusive), on its day only.
test_same_day_window if {
	weekday := {"windows": [{"days": ["Wed"], "start": "13:00", "end": "15:30", "timezone": "UTC"}]}
	count(maintenance_window.deny) == 0 with input as at("2026-12-02T13:00:00Z") with data.maintenance_windows as weekday
	count(maintenance_window.deny) == 0 with input as at("2026-12-02T15:29:00Z") with data.maintenance_windows as weekday
	count(maintenance_window.deny) == 1 with input as at("2026-12-02T15:30:00Z") with data.maintenance_windows as weekday
	count(maintenance_window.deny) == 1 with input as at("2026-12-02T12:59:00Z") with data.maintenance_windows as weekday
	count(maintenance_window.deny) == 1 with input as at("2026-12-03T14:00:00Z") with data.maintenance_windows as weekday
}

# "24:00" ends a window at midnight; start == end is open for a whole day from start.
test_midnight_and_whole_day_windows if {
	count(maintenance_window.deny) == 0 with input as at("2026-11-28T23:59:00Z")
		with data.maintenance_windows as {"windows": [{"days": ["Sat"], "start": "22:00", "end": "24:00"}]}
	count(maintenance_window.deny) == 1 with input as at("2026-11-29T00:00:00Z")
		with data.maintenance_windows as {"windows": [{"days": ["Sat"], "start": "22:00", "end": "24:00"}]}
	count(maintenance_window.deny) == 0 with input as at("2026-11-29T05:59:00Z")
		with data.maintenance_windows as {"windows": [{"days": ["Sat"], "start": "06:00", "end": "06:00"}]}
	count(maintenance_window.deny) == 1 with input as at("2026-11-29T06:00:00Z")
		with data.maintenance_windows as {"windows": [{"days": ["Sat"], "start": "06:00", "end": "06:00"}]}
}

# Day names are matched on their first three letters, in any case.
test_day_names if {
	count(maintenance_window.deny) == 0 with input as at("2026-11-28T22:30:00Z")
		with data.maintenance_windows as {"windows": [{"days": ["SATURDAY"], "start": "22:00", "end": "23:00"}]}
}

# Before planning (no node about to start) nothing is decided, even with no window open.
test_nothing_decided_without_a_next_node if {
	count(maintenance_window.deny) == 0 with input as {"now": "2026-11-27T22:30:00Z", "nodes": []}
		with data.maintenance_windows as berlin_weekend
}
