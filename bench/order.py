"""The order in which a bench's sides take their turns, round by round.

A plain rotation of n sides puts each side right after the same neighbour in most
rounds (of four sides, the ledger before its own floor in 3 of every 4 rounds), so a
side that leaves work behind (dirty buffers, a checkpoint due, autovacuum woken) would
always hand it to the same next side.  A Williams design (a balanced Latin square:
rows 0, 1, n-1, 2, n-2, ... shifted by the round; for an odd n the rows mirrored too)
gives every side each position equally often and each other side as its predecessor
equally often over a full cycle of rounds (n rounds, or 2n for an odd n)."""


def williams_rows(n):
    first, low, high = [0], 1, n - 1
    for k in range(1, n):
        if k % 2:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return rows


def turn_order(names, r):
    """names (a list) in round r's order."""
    rows = williams_rows(len(names))
    return [names[i] for i in rows[r % len(rows)]]
