"""What a fleet file can get wrong, phrased so the person who wrote the file can fix it without reading code."""

from __future__ import annotations

from pydantic import BaseModel


class FleetProblem(BaseModel):
    """One thing wrong with one document, located by document number, object and field path."""

    document: int | None = None  # 1-based position in the file; None for problems of the fleet as a whole
    source: str | None = None  # file name, when known
    kind: str | None = None
    name: str | None = None
    path: str | None = None  # e.g. spec.nodePools[0].nodes[2].slots[1].gpuPci
    message: str

    def __str__(self) -> str:
        where: list[str] = []
        if self.source:
            where.append(self.source)
        if self.document is not None:
            where.append(f"document {self.document}")
        if self.kind or self.name:
            where.append(f"{self.kind or '?'}/{self.name or '?'}")
        head = " ".join(where)
        field = f" {self.path}:" if self.path else ""
        return f"{head}:{field} {self.message}" if head else f"{field.strip()} {self.message}".strip()


class FleetError(Exception):
    """A fleet file that cannot be applied. Carries every problem found, not only the first."""

    def __init__(self, problems: list[FleetProblem]) -> None:
        self.problems = problems
        count = len(problems)
        lines = [f"the fleet file has {count} problem{'s' if count != 1 else ''}:"]
        lines.extend(f"  - {p}" for p in problems)
        super().__init__("\n".join(lines))
