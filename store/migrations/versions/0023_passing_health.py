"""passing health verdicts: a slot's verdict that ends with what caused it

- `node_resource_slots.health_lasting`: whether the stored verdict stands until the slot is repaired (`berth nodes repair`), as a
  GPU's own faults do. A verdict about the VM that holds the slot (its QEMU killed, a crash, a poweroff inside) is
  not the device's fault: it tells the allocation (its health and replacement path) and ends with the VM, so the
  slot serves again once its teardown and wipe are done. Existing verdicts all came from devices: lasting.

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("node_resource_slots", sa.Column("health_lasting", sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    op.drop_column("node_resource_slots", "health_lasting")
