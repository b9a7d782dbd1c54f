"""The types that cross a process boundary: activity inputs and results, audit and deployment messages, cluster
connections and observations, task-queue names. Pydantic only, so every wing (store, workflows, activities, the
node agent, the API) imports them downward and both sides of each call agree on its shape."""
